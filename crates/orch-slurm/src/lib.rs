//! orch on Slurm. orch grows no cluster manager of its own: research clusters run Slurm, and orch
//! runs on it with the job files people already use with `orch run`.
//!
//! - [`script`]: a job file as a batch script (`orch submit --slurm`): `#SBATCH` lines from the
//!   job's resources, `max_runtime` and `[slurm]` table, a job array for a `[sweep]`, and the body
//!   that runs `orch run` inside the allocation (through `srun`, one per node, across nodes).
//! - [`cluster_from_env`]: inside a multi-node allocation, this node's place among the nodes, for
//!   torchrun's variables and `TF_CONFIG` ([`orch_exec::Cluster`]).
//! - [`squeue`]: Slurm's own view of the user's jobs (`squeue --json`).
//! - [`command`]: Slurm's commands, with one sentence when they are missing.

pub mod command;
pub mod script;
pub mod squeue;

use orch_exec::Cluster;

/// The rendezvous port of Slurm job `job_id`: the same on every node, and different for jobs
/// that might share a node (20000-39999).
pub fn master_port(job_id: u64) -> u16 {
    20_000 + (job_id % 20_000) as u16
}

/// This node's place in a multi-node allocation, from Slurm's variables (`var`) and the host
/// names of its node list (`hostnames`, `scontrol show hostnames` in practice). `None` outside
/// Slurm or on a single node.
pub fn cluster_from_env(
    var: &dyn Fn(&str) -> Option<String>,
    hostnames: &dyn Fn(&str) -> Result<Vec<String>, String>,
) -> Option<Result<Cluster, String>> {
    let nodes: u32 = var("SLURM_JOB_NUM_NODES")
        .or_else(|| var("SLURM_NNODES"))
        .and_then(|n| n.trim().parse().ok())?;
    if nodes <= 1 {
        return None;
    }
    Some((|| {
        let node_rank: u32 = var("SLURM_NODEID")
            .and_then(|n| n.trim().parse().ok())
            .ok_or("SLURM_NODEID is not set: run one `orch run` per node through srun")?;
        let list = var("SLURM_JOB_NODELIST")
            .or_else(|| var("SLURM_NODELIST"))
            .ok_or("SLURM_JOB_NODELIST is not set")?;
        let hosts = hostnames(&list)?;
        if hosts.len() != nodes as usize {
            return Err(format!(
                "the node list {list} names {} host(s), and Slurm says {nodes} node(s)",
                hosts.len()
            ));
        }
        let job_id: u64 = var("SLURM_JOB_ID")
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0);
        Ok(Cluster {
            node_rank,
            hosts,
            master_port: master_port(job_id),
        })
    })())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    fn expand(list: &str) -> Result<Vec<String>, String> {
        // What `scontrol show hostnames gpu[01-02]` prints.
        assert_eq!(list, "gpu[01-02]");
        Ok(vec!["gpu01".into(), "gpu02".into()])
    }

    #[test]
    fn two_nodes_from_slurms_variables() {
        let var = env(&[
            ("SLURM_JOB_NUM_NODES", "2"),
            ("SLURM_NODEID", "1"),
            ("SLURM_JOB_NODELIST", "gpu[01-02]"),
            ("SLURM_JOB_ID", "4242"),
        ]);
        let cluster = cluster_from_env(&var, &expand).unwrap().unwrap();
        assert_eq!(cluster.node_rank, 1);
        assert_eq!(cluster.master_addr(), "gpu01");
        assert_eq!(cluster.master_port, 24242);
        // Node 1 of 2, four GPUs each, per-device launch: the third process there is rank 6.
        let job = orch_exec::JobEnv {
            devices: (0..4)
                .map(|i| orch_exec::AssignedDevice {
                    cuda_id: format!("GPU-{i}"),
                    memory_total_bytes: None,
                })
                .collect(),
            cluster: Some(cluster),
            ..orch_exec::JobEnv::default()
        };
        let vars = orch_exec::process_env(&job, Some(2), 0);
        assert_eq!(vars["RANK"], "6");
        assert_eq!(vars["WORLD_SIZE"], "8");
        assert_eq!(vars["NODE_RANK"], "1");
        assert_eq!(vars["MASTER_ADDR"], "gpu01");
        assert_eq!(vars["MASTER_PORT"], "24242");
    }

    #[test]
    fn one_node_or_no_slurm_is_no_cluster_and_mistakes_are_sentences() {
        assert!(cluster_from_env(&env(&[]), &expand).is_none());
        assert!(cluster_from_env(&env(&[("SLURM_NNODES", "1")]), &expand).is_none());
        let e = cluster_from_env(&env(&[("SLURM_NNODES", "2")]), &expand)
            .unwrap()
            .unwrap_err();
        assert!(e.contains("SLURM_NODEID"), "{e}");
        let three = env(&[
            ("SLURM_NNODES", "3"),
            ("SLURM_NODEID", "0"),
            ("SLURM_JOB_NODELIST", "gpu[01-02]"),
        ]);
        let e = cluster_from_env(&three, &expand).unwrap().unwrap_err();
        assert!(e.contains("2 host(s)") && e.contains("3 node(s)"), "{e}");
    }
}
