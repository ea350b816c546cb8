//! Test fixture `trainer-fixture-predict`: a `predicting-trainer` (contract 0.3.0) whose
//! training does nothing and whose `predict` misbehaves as `[train.config] mode` says:
//!
//! - `nan`: logits `[rows, t, classes]` for token ids `[rows, t]`, every one NaN;
//! - `inf-last`: finite logits, but the last class of the last position is +infinity;
//! - `long-error`: an error of `bytes` (default 32 MiB) characters, on one line;
//! - `expanded`: one zero expanded to `[1, 2^20, 2^20]`, a view of 4 bytes that shows 4 TiB;
//! - anything else: zero logits (a model that predicts, for comparison).

use bindings::exports::orch::plugin::training::{EvalReport, Guest, RunInfo, StepInfo, StepReport};
use bindings::orch::plugin::tensors::{self as t, Tensor, TensorError};
use bindings::orch::plugin::{data, params};
use std::cell::RefCell;

// The generated export glue takes `run-info`'s fields as flat arguments.
#[allow(clippy::too_many_arguments)]
mod bindings {
    wit_bindgen::generate!({
        path: "../../../wit",
        world: "predicting-trainer",
    });
}

struct State {
    mode: String,
    bytes: usize,
    classes: u32,
}

thread_local! {
    static STATE: RefCell<Option<State>> = const { RefCell::new(None) };
}

fn err(e: TensorError) -> String {
    format!("{e:?}")
}

struct Fixture;

impl Guest for Fixture {
    fn init_replica(config: Vec<(String, String)>, info: RunInfo) -> Result<(), String> {
        let get = |key: &str| {
            config
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.clone())
        };
        let mode = get("mode").unwrap_or_default();
        let bytes = get("bytes")
            .and_then(|b| b.parse().ok())
            .unwrap_or(32 << 20);
        params::register("w", &t::full(&[1], 0.0, None).map_err(err)?).map_err(err)?;
        STATE.with(|s| {
            *s.borrow_mut() = Some(State {
                mode,
                bytes,
                classes: info.classes,
            })
        });
        Ok(())
    }

    fn train_step(_step: StepInfo) -> Result<StepReport, String> {
        data::train_batch().map_err(err)?;
        Ok(StepReport { loss: 0.0 })
    }

    fn eval_step(_step: StepInfo) -> Result<EvalReport, String> {
        let batch = data::eval_batch().map_err(err)?;
        Ok(EvalReport {
            loss: 0.0,
            correct: 0,
            rows: batch.rows,
        })
    }
}

impl bindings::exports::orch::plugin::inference::Guest for Fixture {
    fn predict(features: Tensor) -> Result<Tensor, String> {
        STATE.with(|s| {
            let guard = s.borrow();
            let state = guard.as_ref().ok_or("no init")?;
            let mut shape = features.shape();
            shape.push(state.classes);
            match state.mode.as_str() {
                "nan" => t::full(&shape, f32::NAN, None).map_err(err),
                "inf-last" => {
                    let numel: u32 = shape.iter().product();
                    let mut values = vec![0.5; numel as usize];
                    if let Some(last) = values.last_mut() {
                        *last = f32::INFINITY;
                    }
                    t::from_list(&values, &shape, None).map_err(err)
                }
                "long-error" => Err("e".repeat(state.bytes)),
                "expanded" => {
                    let one = t::full(&[1, 1, 1], 0.0, None).map_err(err)?;
                    t::expand(&one, &[1, 1 << 20, 1 << 20]).map_err(err)
                }
                _ => t::full(&shape, 0.0, None).map_err(err),
            }
        })
    }
}

bindings::export!(Fixture with_types_in bindings);
