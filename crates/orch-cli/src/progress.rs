//! How `orch run` shows a training run, from the trainer's progress events: a bar (indicatif)
//! redrawn in place when stdout is a terminal, plain lines otherwise (logs, CI, a daemon's job
//! files: a step line every tenth of an epoch). Either way the run's start, each epoch's
//! summary, the trainer's log lines and the run's end are lines of their own.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use orch_trainer::{ProgressEvent, ProgressSink};
use std::io::{IsTerminal, Write};
use std::sync::Mutex;
use std::time::Duration;

/// The sink `orch run` hands the trainer: a bar when stdout is a terminal, else lines.
pub fn sink() -> ProgressSink {
    let display = if std::io::stdout().is_terminal() {
        Display::bar()
    } else {
        Display::lines(Box::new(std::io::stdout()))
    };
    let display = Mutex::new(display);
    ProgressSink::new(move |event| orch_core::sync::lock(&display).show(event))
}

/// The sink of a trainer whose progress goes to `out` as lines (a daemon's `[train]` job: its
/// stdout log), whatever this process's stdout is.
pub fn lines(out: Box<dyn Write + Send>) -> ProgressSink {
    let display = Mutex::new(Display::lines(out));
    ProgressSink::new(move |event| orch_core::sync::lock(&display).show(event))
}

enum Mode {
    /// A bar per epoch, drawn to stdout (a terminal) by indicatif.
    Bar(Option<ProgressBar>),
    /// Lines written to `out`.
    Lines(Box<dyn Write + Send>),
}

struct Display {
    mode: Mode,
}

impl Display {
    fn bar() -> Display {
        Display {
            mode: Mode::Bar(None),
        }
    }

    fn lines(out: Box<dyn Write + Send>) -> Display {
        Display {
            mode: Mode::Lines(out),
        }
    }

    fn show(&mut self, event: ProgressEvent) {
        match event {
            ProgressEvent::Started { text, .. } => self.line(&text),
            ProgressEvent::Step {
                step_in_epoch,
                batches_per_epoch,
                ..
            } => {
                let text = step_text(&event);
                match &mut self.mode {
                    Mode::Lines(out) => {
                        let every = u64::from(batches_per_epoch / 10).max(1);
                        if step_in_epoch.is_multiple_of(every)
                            || step_in_epoch == u64::from(batches_per_epoch)
                        {
                            let _ = writeln!(out, "{text}");
                        }
                    }
                    Mode::Bar(bar) => {
                        let bar = bar.get_or_insert_with(|| new_bar(batches_per_epoch));
                        bar.set_position(step_in_epoch);
                        bar.set_message(text);
                    }
                }
            }
            ProgressEvent::Log {
                who,
                warning,
                message,
            } => {
                let tag = if warning { "warning: " } else { "" };
                let text = format!("[{who}] {tag}{message}");
                match &mut self.mode {
                    // Above the bar, which stays where it is.
                    Mode::Bar(Some(bar)) => bar.println(text),
                    _ => self.line(&text),
                }
            }
            ProgressEvent::Epoch { .. }
            | ProgressEvent::Eval { .. }
            | ProgressEvent::NothingToResume { .. }
            | ProgressEvent::Finished { .. }
            | ProgressEvent::Sample { .. } => self.line(&summary_text(&event)),
        }
    }

    /// A line of its own: the epoch's bar, if any, is left as it ended.
    fn line(&mut self, text: &str) {
        match &mut self.mode {
            Mode::Bar(bar) => {
                if let Some(bar) = bar.take() {
                    bar.abandon();
                }
                println!("{text}");
            }
            Mode::Lines(out) => {
                let _ = writeln!(out, "{text}");
            }
        }
    }
}

fn new_bar(batches: u32) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(u64::from(batches)), ProgressDrawTarget::stdout());
    // `wide_msg` cuts the text at the terminal's width: a line that wrapped would be redrawn
    // one line lower each time. The template is fixed, so parsing it does not fail.
    if let Ok(style) = ProgressStyle::with_template("[{bar:24}] {wide_msg}") {
        bar.set_style(style.progress_chars("#."));
    }
    bar
}

/// `epoch 1/2 step 5/28 loss 0.1234  1234 samples/s  ETA 4:05`.
fn step_text(event: &ProgressEvent) -> String {
    let ProgressEvent::Step {
        epoch,
        epochs,
        step_in_epoch,
        batches_per_epoch,
        loss,
        samples_per_sec,
        eta,
        ..
    } = event
    else {
        return String::new();
    };
    format!(
        "epoch {epoch}/{epochs} step {step_in_epoch}/{batches_per_epoch} loss {loss:.4}  {samples_per_sec:.0} samples/s  ETA {}",
        clock(*eta),
    )
}

/// The line of an epoch's end, of a resume with nothing to do, or of the run's end.
fn summary_text(event: &ProgressEvent) -> String {
    match event {
        ProgressEvent::Epoch {
            epoch,
            epochs,
            train_loss,
            eval_loss,
            eval_accuracy,
            seconds,
        } => {
            let scores = match (eval_loss, eval_accuracy) {
                (Some(l), Some(a)) => {
                    format!(", test loss {l:.4}, test accuracy {:.2}%", a * 100.0)
                }
                (Some(l), None) => format!(", test loss {l:.4}"),
                _ => String::new(),
            };
            format!("epoch {epoch}/{epochs}: train loss {train_loss:.4}{scores} ({seconds:.1} s)")
        }
        ProgressEvent::Eval {
            step,
            total_steps,
            eval_loss,
            eval_accuracy,
            train_seconds,
        } => {
            let accuracy =
                eval_accuracy.map_or_else(String::new, |a| format!(", accuracy {:.2}%", a * 100.0));
            format!(
                "step {step}/{total_steps}: eval loss {eval_loss:.4}{accuracy} ({train_seconds:.1} s of training)"
            )
        }
        ProgressEvent::Sample {
            text,
            tokens,
            temperature,
            seed,
            path,
        } => format!(
            "sample, {tokens} characters at temperature {temperature} with seed {seed} (saved in {}; `orch sample` writes more):\n{}",
            path.display(),
            text.trim_end_matches('\n')
        ),
        ProgressEvent::NothingToResume { job, step, epoch } => format!(
            "{job}: the checkpoint is at the end of the run ({step} steps, {epoch} epochs): nothing to resume; raise [train] epochs (or steps) to train further"
        ),
        ProgressEvent::Finished {
            steps,
            seconds,
            eval_loss,
            eval_accuracy,
            stopped_early,
            metrics,
            plot,
            checkpoint,
        } => {
            let scores = match (eval_loss, eval_accuracy) {
                (_, Some(a)) => format!("; test accuracy {:.2}%", a * 100.0),
                (Some(l), None) => format!("; eval loss {l:.4}"),
                _ => String::new(),
            };
            let how = if *stopped_early {
                "stopped as asked after"
            } else {
                "done:"
            };
            format!(
                "{how} {steps} steps in {seconds:.1} s{scores}; metrics {}, plot {}, checkpoint {}",
                metrics.display(),
                plot.display(),
                checkpoint.display()
            )
        }
        _ => String::new(),
    }
}

/// `1:02:03`, `4:05` or `7s`.
fn clock(d: Duration) -> String {
    let s = d.as_secs();
    match (s / 3600, s / 60 % 60, s % 60) {
        (0, 0, sec) => format!("{sec}s"),
        (0, m, sec) => format!("{m}:{sec:02}"),
        (h, m, sec) => format!("{h}:{m:02}:{sec:02}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;
    use std::sync::Arc;

    #[test]
    fn clocks_read_naturally() {
        assert_eq!(clock(Duration::from_secs(7)), "7s");
        assert_eq!(clock(Duration::from_secs(245)), "4:05");
        assert_eq!(clock(Duration::from_secs(3723)), "1:02:03");
    }

    /// A writer the test can read back.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn step(step: u64, in_epoch: u64) -> ProgressEvent {
        ProgressEvent::Step {
            step,
            epoch: 1,
            epochs: 2,
            step_in_epoch: in_epoch,
            batches_per_epoch: 20,
            loss: 0.5,
            samples_per_sec: 1000.4,
            eta: Duration::from_secs(65),
        }
    }

    #[test]
    fn without_a_terminal_every_tenth_step_and_each_epoch_is_a_line() {
        let out = Shared::default();
        let mut display = Display::lines(Box::new(out.clone()));
        display.show(ProgressEvent::Started {
            text: "training digits".into(),
            epochs: 2,
            batches_per_epoch: 20,
            first_step: 0,
        });
        for s in 1..=20 {
            display.show(step(s, s));
        }
        display.show(ProgressEvent::Log {
            who: "mlp r1".into(),
            warning: true,
            message: "slow".into(),
        });
        display.show(ProgressEvent::Epoch {
            epoch: 1,
            epochs: 2,
            train_loss: 0.25,
            eval_loss: Some(0.5),
            eval_accuracy: Some(0.9),
            seconds: 1.25,
        });
        display.show(ProgressEvent::Finished {
            steps: 20,
            seconds: 2.5,
            eval_loss: Some(0.3),
            eval_accuracy: Some(0.9),
            stopped_early: true,
            metrics: PathBuf::from("runs/m.jsonl"),
            plot: PathBuf::from("runs/p.svg"),
            checkpoint: PathBuf::from("runs/checkpoint"),
        });
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "training digits");
        assert_eq!(
            lines[1],
            "epoch 1/2 step 2/20 loss 0.5000  1000 samples/s  ETA 1:05"
        );
        assert_eq!(lines.len(), 1 + 10 + 3, "{text}");
        assert_eq!(lines[11], "[mlp r1] warning: slow");
        assert_eq!(
            lines[12],
            "epoch 1/2: train loss 0.2500, test loss 0.5000, test accuracy 90.00% (1.2 s)"
        );
        assert_eq!(
            lines[13],
            "stopped as asked after 20 steps in 2.5 s; test accuracy 90.00%; metrics runs/m.jsonl, plot runs/p.svg, checkpoint runs/checkpoint"
        );
    }
}
