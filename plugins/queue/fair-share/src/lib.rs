//! Built-in queue policy `fair-share`: tenant fair-share factor (share against decayed usage), then job priority, then age, exactly as `orch_queue::fair_share` orders (the
//! same code, compiled for the sandbox).

orch_queue_kit::export_order!(orch_queue_kit::orch_queue::fair_share);
