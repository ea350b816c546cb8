//! What a person watching a run sees: a progress bar per epoch when stdout is a terminal, plain
//! lines otherwise (one every tenth of an epoch), an epoch summary line, the plugin's log lines.

use std::io::Write;
use std::time::{Duration, Instant};

/// How progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgressMode {
    /// A bar redrawn in place (stdout is a terminal).
    Bar,
    /// A line every tenth of an epoch and one per epoch (logs, CI).
    Lines,
    /// Nothing (tests, embedding).
    Quiet,
}

impl ProgressMode {
    /// `Bar` when stdout is a terminal, else `Lines`.
    pub fn detect() -> ProgressMode {
        use std::io::IsTerminal;
        if std::io::stdout().is_terminal() {
            ProgressMode::Bar
        } else {
            ProgressMode::Lines
        }
    }
}

/// The running display of one run.
#[derive(Debug)]
pub(crate) struct Progress {
    mode: ProgressMode,
    epochs: u32,
    batches: u32,
    total_steps: u64,
    first_step: u64,
    started: Instant,
    samples: u64,
    last_draw: Option<Instant>,
    bar_open: bool,
}

/// The fields of one step as shown.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StepView {
    /// Steps done, over the run.
    pub step: u64,
    /// 0-based.
    pub epoch: u32,
    pub loss: f32,
    pub rows: usize,
}

impl Progress {
    pub fn new(mode: ProgressMode, epochs: u32, batches: u32, first_step: u64) -> Progress {
        Progress {
            mode,
            epochs,
            batches,
            total_steps: u64::from(epochs) * u64::from(batches),
            first_step,
            started: Instant::now(),
            samples: 0,
            last_draw: None,
            bar_open: false,
        }
    }

    /// Samples per second since this process started training.
    pub fn throughput(&self) -> f64 {
        let secs = self.started.elapsed().as_secs_f64();
        if secs > 0.0 {
            self.samples as f64 / secs
        } else {
            0.0
        }
    }

    pub fn line(&mut self, text: &str) {
        if self.mode == ProgressMode::Quiet {
            return;
        }
        self.close_bar();
        println!("{text}");
    }

    pub fn step(&mut self, view: StepView) {
        self.samples += view.rows as u64;
        let in_epoch = view.step - u64::from(view.epoch) * u64::from(self.batches);
        let text = format!(
            "epoch {}/{} {} loss {:.4}  {:.0} samples/s  ETA {}",
            view.epoch + 1,
            self.epochs,
            self.counter(in_epoch),
            view.loss,
            self.throughput(),
            clock(self.eta(view.step)),
        );
        match self.mode {
            ProgressMode::Quiet => {}
            ProgressMode::Lines => {
                let every = u64::from(self.batches / 10).max(1);
                if in_epoch.is_multiple_of(every) || in_epoch == u64::from(self.batches) {
                    println!("{text}");
                }
            }
            ProgressMode::Bar => {
                let due = self
                    .last_draw
                    .is_none_or(|t| t.elapsed() >= Duration::from_millis(100));
                if due || in_epoch == u64::from(self.batches) {
                    let fraction = in_epoch as f64 / f64::from(self.batches.max(1));
                    let filled = (fraction * 24.0).round() as usize;
                    let bar = format!(
                        "[{}{}]",
                        "#".repeat(filled),
                        ".".repeat(24 - filled.min(24))
                    );
                    print!("\r\x1b[2K{bar} {text}");
                    let _ = std::io::stdout().flush();
                    self.last_draw = Some(Instant::now());
                    self.bar_open = true;
                }
            }
        }
    }

    fn counter(&self, in_epoch: u64) -> String {
        format!("step {in_epoch}/{}", self.batches)
    }

    fn eta(&self, step: u64) -> Duration {
        let done = step.saturating_sub(self.first_step);
        if done == 0 {
            return Duration::ZERO;
        }
        let per_step = self.started.elapsed().as_secs_f64() / done as f64;
        Duration::from_secs_f64(per_step * self.total_steps.saturating_sub(step) as f64)
    }

    fn close_bar(&mut self) {
        if self.bar_open {
            println!();
            self.bar_open = false;
        }
    }

    pub fn finish(&mut self) {
        self.close_bar();
    }
}

/// `1:02:03`, `4:05` or `7s`.
pub(crate) fn clock(d: Duration) -> String {
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

    #[test]
    fn clocks_read_naturally() {
        assert_eq!(clock(Duration::from_secs(7)), "7s");
        assert_eq!(clock(Duration::from_secs(245)), "4:05");
        assert_eq!(clock(Duration::from_secs(3723)), "1:02:03");
    }
}
