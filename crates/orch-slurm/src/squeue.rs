//! The user's jobs as Slurm sees them (`squeue --me --json`): only those orch submitted (their
//! comment is `orch`).

use serde::{Deserialize, Serialize};

/// One Slurm job (an array's task is a job of its own).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SlurmJob {
    /// `1234`, or `1234_5` for task 5 of array 1234.
    pub id: String,
    pub job_id: u64,
    pub name: String,
    pub state: String,
    /// The nodes it runs on (empty while pending).
    pub nodes: String,
    /// GPUs per node, from `tres_per_node` (`gres:gpu:2`).
    pub gpus_per_node: Option<u32>,
    pub node_count: Option<u64>,
    pub array_task: Option<u64>,
    /// Why it waits, while it does.
    pub reason: String,
}

#[derive(Deserialize)]
struct Raw {
    #[serde(default)]
    jobs: Vec<serde_json::Value>,
}

impl SlurmJob {
    /// Slurm is done with it (squeue keeps ended jobs for a few minutes).
    pub fn ended(&self) -> bool {
        const ENDED: &[&str] = &[
            "COMPLETED",
            "CANCELLED",
            "FAILED",
            "TIMEOUT",
            "NODE_FAIL",
            "PREEMPTED",
            "BOOT_FAIL",
            "DEADLINE",
            "OUT_OF_MEMORY",
            "REVOKED",
            "SPECIAL_EXIT",
        ];
        self.state.split(',').any(|s| ENDED.contains(&s.trim()))
    }
}

/// The orch jobs of a `squeue --json` answer.
pub fn parse(text: &str) -> Result<Vec<SlurmJob>, String> {
    let raw: Raw = serde_json::from_str(text)
        .map_err(|e| format!("squeue --json answered something else: {e}"))?;
    let str_of = |v: &serde_json::Value, key: &str| v[key].as_str().unwrap_or("").to_string();
    // Slurm's JSON numbers are plain numbers in some releases and {"set", "number"} in others.
    let num_of = |v: &serde_json::Value, key: &str| -> Option<u64> {
        let field = &v[key];
        field.as_u64().or_else(|| {
            (field["set"] == true)
                .then(|| field["number"].as_u64())
                .flatten()
        })
    };
    let mut out = Vec::new();
    for job in raw.jobs {
        if str_of(&job, "comment") != "orch" {
            continue;
        }
        let Some(job_id) = num_of(&job, "job_id") else {
            continue;
        };
        let array_job = num_of(&job, "array_job_id").filter(|&a| a != 0);
        let array_task = num_of(&job, "array_task_id").filter(|_| array_job.is_some());
        let id = match (array_job, array_task) {
            (Some(a), Some(t)) => format!("{a}_{t}"),
            (Some(a), None) => format!("{a}_[{}]", str_of(&job, "array_task_string")),
            _ => job_id.to_string(),
        };
        let state = match &job["job_state"] {
            serde_json::Value::Array(list) => list
                .iter()
                .filter_map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(","),
            other => other.as_str().unwrap_or("").to_string(),
        };
        let gpus_per_node = str_of(&job, "tres_per_node")
            .split(',')
            .find_map(|t| {
                t.strip_prefix("gres:gpu:")
                    .or_else(|| t.strip_prefix("gres/gpu:"))
            })
            .and_then(|n| n.rsplit(':').next().and_then(|n| n.parse().ok()));
        out.push(SlurmJob {
            id,
            job_id,
            name: str_of(&job, "name"),
            state,
            nodes: str_of(&job, "nodes"),
            gpus_per_node,
            node_count: num_of(&job, "node_count"),
            array_task,
            reason: str_of(&job, "state_reason"),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orch_jobs_and_array_tasks() {
        let text = r#"{"jobs": [
          {"job_id": 2, "name": "hello", "job_state": "RUNNING", "nodes": "vm", "array_job_id": 1,
           "array_task_id": 0, "comment": "orch", "tres_per_node": "gres:gpu:a100:2", "node_count": 1,
           "state_reason": "None"},
          {"job_id": 3, "name": "mine", "job_state": "PENDING", "nodes": "", "array_job_id": 0,
           "array_task_id": {"set": false, "number": 0}, "comment": "orch", "tres_per_node": "gres:gpu:1",
           "state_reason": "Resources"},
          {"job_id": 4, "name": "not orch", "job_state": "RUNNING", "comment": ""}
        ]}"#;
        let jobs = parse(text).unwrap();
        assert_eq!(jobs.len(), 2);
        assert_eq!(
            (jobs[0].id.as_str(), jobs[0].gpus_per_node),
            ("1_0", Some(2))
        );
        assert_eq!(
            (jobs[1].id.as_str(), jobs[1].state.as_str()),
            ("3", "PENDING")
        );
        assert!(parse("not json").unwrap_err().contains("squeue --json"));
    }
}
