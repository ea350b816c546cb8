//! Built-in queue policy `priority`: job priority, then age, exactly as `orch_queue::priority` orders (the
//! same code, compiled for the sandbox).

orch_queue_kit::export_order!(orch_queue_kit::orch_queue::priority);
