//! Built-in queue policy `fifo`: submission order, exactly as `orch_queue::fifo` orders (the
//! same code, compiled for the sandbox).

orch_queue_kit::export_order!(orch_queue_kit::orch_queue::fifo);
