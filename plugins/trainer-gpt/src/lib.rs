//! Placeholder while the trainer is written.
use orch_trainer_kit::{EvalReport, Guest, InferenceGuest, RunInfo, StepInfo, StepReport, Tensor, export_trainer};
struct T;
impl Guest for T {
    fn init_replica(_: Vec<(String, String)>, _: RunInfo) -> Result<(), String> { Err("unfinished".into()) }
    fn train_step(_: StepInfo) -> Result<StepReport, String> { Err("unfinished".into()) }
    fn eval_step(_: StepInfo) -> Result<EvalReport, String> { Err("unfinished".into()) }
}
impl InferenceGuest for T {
    fn predict(_: Tensor) -> Result<Tensor, String> { Err("unfinished".into()) }
}
export_trainer!(T);
