//! The environment a job's process receives.

use std::collections::BTreeMap;

/// A device granted to the job, as CUDA should be told about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AssignedDevice {
    /// `GPU-…` or `MIG-…`; empty for the CPU device (the job then sees no GPU).
    pub cuda_id: String,
    pub memory_total_bytes: Option<u64>,
}

/// What a job's processes share.
#[derive(Debug, Clone, Default)]
pub struct JobEnv {
    pub job_id: String,
    pub devices: Vec<AssignedDevice>,
    pub memory_limit_bytes: Option<u64>,
    pub exclusive: bool,
    /// The job's own variables (`[command] env`); they win over orch's, except the device ones.
    pub extra: BTreeMap<String, String>,
    /// The machines of a job that spans several (Slurm): this one's place among them.
    pub cluster: Option<Cluster>,
}

/// A job across machines: one `orch run` per node, each launching its node's processes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cluster {
    /// This node's rank (`SLURM_NODEID`).
    pub node_rank: u32,
    /// Every node's host name, in rank order (the allocation's).
    pub hosts: Vec<String>,
    /// Rendezvous port on the first host.
    pub master_port: u16,
}

impl Cluster {
    pub fn nodes(&self) -> usize {
        self.hosts.len()
    }

    pub fn master_addr(&self) -> &str {
        self.hosts.first().map_or("127.0.0.1", String::as_str)
    }

    /// TensorFlow's `TF_CONFIG` for worker `index` of a cluster whose workers are each node's
    /// `per_node` processes (ports after the rendezvous port).
    pub fn tf_config(&self, per_node: usize, index: usize) -> String {
        let workers: Vec<String> = self
            .hosts
            .iter()
            .flat_map(|host| {
                (0..per_node).map(move |local| {
                    format!(
                        "\"{host}:{}\"",
                        u32::from(self.master_port) + 1 + local as u32
                    )
                })
            })
            .collect();
        format!(
            "{{\"cluster\": {{\"worker\": [{}]}}, \"task\": {{\"type\": \"worker\", \"index\": {index}}}}}",
            workers.join(", ")
        )
    }
}

/// The variables process `rank` of a job gets (`None`: the single process of a `single` launch);
/// `master_port` is the rendezvous port of a per-device launch.
pub fn process_env(
    job: &JobEnv,
    rank: Option<usize>,
    master_port: u16,
) -> BTreeMap<String, String> {
    let mut vars: BTreeMap<String, String> = job.extra.clone();
    let devices: Vec<&AssignedDevice> = match rank {
        Some(r) => job.devices.get(r).into_iter().collect(),
        None => job.devices.iter().collect(),
    };
    let ids: Vec<&str> = devices
        .iter()
        .map(|d| d.cuda_id.as_str())
        .filter(|id| !id.is_empty())
        .collect();
    vars.insert("CUDA_VISIBLE_DEVICES".into(), ids.join(","));
    vars.insert("CUDA_DEVICE_ORDER".into(), "PCI_BUS_ID".into());
    vars.insert("ORCH_JOB_ID".into(), job.job_id.clone());
    memory_vars(job, &devices, &mut vars);
    match (&job.cluster, rank) {
        (None, Some(rank)) => {
            let world = job.devices.len().to_string();
            vars.insert("RANK".into(), rank.to_string());
            vars.insert("LOCAL_RANK".into(), rank.to_string());
            vars.insert("WORLD_SIZE".into(), world.clone());
            vars.insert("LOCAL_WORLD_SIZE".into(), world);
            vars.insert("GROUP_RANK".into(), "0".into());
            vars.insert("MASTER_ADDR".into(), "127.0.0.1".into());
            vars.insert("MASTER_PORT".into(), master_port.to_string());
        }
        // Across nodes: torchrun's variables from the node's rank, and TF_CONFIG. A single launch
        // is one process per node; a per-device launch one per device of each node.
        (Some(cluster), rank) => {
            let per_node = if rank.is_some() {
                job.devices.len().max(1)
            } else {
                1
            };
            let local = rank.unwrap_or(0);
            let global = cluster.node_rank as usize * per_node + local;
            vars.insert("RANK".into(), global.to_string());
            vars.insert("LOCAL_RANK".into(), local.to_string());
            vars.insert(
                "WORLD_SIZE".into(),
                (cluster.nodes() * per_node).to_string(),
            );
            vars.insert("LOCAL_WORLD_SIZE".into(), per_node.to_string());
            vars.insert("GROUP_RANK".into(), cluster.node_rank.to_string());
            vars.insert("NODE_RANK".into(), cluster.node_rank.to_string());
            vars.insert("NNODES".into(), cluster.nodes().to_string());
            vars.insert("MASTER_ADDR".into(), cluster.master_addr().to_string());
            vars.insert("MASTER_PORT".into(), cluster.master_port.to_string());
            vars.entry("TF_CONFIG".into())
                .or_insert_with(|| cluster.tf_config(per_node, global));
        }
        (None, None) => {}
    }
    vars
}

/// Memory-limit hints for the frameworks that read them. A variable the job sets itself is kept.
///
/// - `ORCH_MEMORY_LIMIT_BYTES`: the per-device limit, for the job's own code.
/// - TensorFlow grabs all GPU memory at start unless `TF_FORCE_GPU_ALLOW_GROWTH=true`: set whenever
///   the device may be shared or a limit is given.
/// - JAX preallocates 75% of the device: with a limit, `XLA_PYTHON_CLIENT_MEM_FRACTION` becomes the
///   limit's share of the smallest device; on a shared device without a limit,
///   `XLA_PYTHON_CLIENT_PREALLOCATE=false`.
fn memory_vars(job: &JobEnv, devices: &[&AssignedDevice], vars: &mut BTreeMap<String, String>) {
    let mut set = |key: &str, value: String| {
        vars.entry(key.to_string()).or_insert(value);
    };
    if let Some(limit) = job.memory_limit_bytes {
        set("ORCH_MEMORY_LIMIT_BYTES", limit.to_string());
        let smallest = devices.iter().filter_map(|d| d.memory_total_bytes).min();
        if let Some(total) = smallest.filter(|&t| t > 0) {
            let fraction = (limit as f64 / total as f64).min(1.0);
            set("XLA_PYTHON_CLIENT_MEM_FRACTION", format!("{fraction:.3}"));
        }
    }
    if job.memory_limit_bytes.is_some() || !job.exclusive {
        set("TF_FORCE_GPU_ALLOW_GROWTH", "true".into());
    }
    if !job.exclusive && job.memory_limit_bytes.is_none() {
        set("XLA_PYTHON_CLIENT_PREALLOCATE", "false".into());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job() -> JobEnv {
        JobEnv {
            job_id: "train-1234abcd".into(),
            devices: vec![
                AssignedDevice {
                    cuda_id: "GPU-aaaa".into(),
                    memory_total_bytes: Some(80 << 30),
                },
                AssignedDevice {
                    cuda_id: "MIG-bbbb".into(),
                    memory_total_bytes: Some(40 << 30),
                },
            ],
            memory_limit_bytes: Some(20 << 30),
            exclusive: true,
            extra: BTreeMap::from([
                ("WANDB_MODE".into(), "offline".into()),
                ("CUDA_VISIBLE_DEVICES".into(), "7".into()),
            ]),
            cluster: None,
        }
    }

    #[test]
    fn across_nodes_ranks_follow_the_node_and_tf_config_names_every_worker() {
        let mut job = job();
        job.cluster = Some(Cluster {
            node_rank: 1,
            hosts: vec!["gpu-a".into(), "gpu-b".into()],
            master_port: 21234,
        });
        // Per-device launch: two processes per node, this is node 1's second.
        let vars = process_env(&job, Some(1), 0);
        for (key, value) in [
            ("RANK", "3"),
            ("LOCAL_RANK", "1"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("NODE_RANK", "1"),
            ("GROUP_RANK", "1"),
            ("NNODES", "2"),
            ("MASTER_ADDR", "gpu-a"),
            ("MASTER_PORT", "21234"),
            ("CUDA_VISIBLE_DEVICES", "MIG-bbbb"),
        ] {
            assert_eq!(vars[key], value, "{key}");
        }
        let tf: serde_json::Value = serde_json::from_str(&vars["TF_CONFIG"]).unwrap();
        assert_eq!(
            tf["cluster"]["worker"],
            serde_json::json!(["gpu-a:21235", "gpu-a:21236", "gpu-b:21235", "gpu-b:21236"])
        );
        assert_eq!(tf["task"]["index"], 3);
        // A single launch: one process per node.
        let vars = process_env(&job, None, 0);
        assert_eq!(
            (vars["RANK"].as_str(), vars["WORLD_SIZE"].as_str()),
            ("1", "2")
        );
    }

    #[test]
    fn single_launch_sees_every_device_by_uuid() {
        let vars = process_env(&job(), None, 0);
        assert_eq!(
            vars["CUDA_VISIBLE_DEVICES"], "GPU-aaaa,MIG-bbbb",
            "the job cannot override its devices"
        );
        assert_eq!(vars["CUDA_DEVICE_ORDER"], "PCI_BUS_ID");
        assert_eq!(vars["ORCH_JOB_ID"], "train-1234abcd");
        assert_eq!(vars["WANDB_MODE"], "offline");
        assert_eq!(vars["ORCH_MEMORY_LIMIT_BYTES"], (20u64 << 30).to_string());
        assert_eq!(
            vars["XLA_PYTHON_CLIENT_MEM_FRACTION"], "0.500",
            "a share of the smallest device"
        );
        assert_eq!(vars["TF_FORCE_GPU_ALLOW_GROWTH"], "true");
        assert!(!vars.contains_key("RANK"));
    }

    #[test]
    fn per_device_processes_see_one_device_and_torchrun_variables() {
        let vars = process_env(&job(), Some(1), 29500);
        assert_eq!(vars["CUDA_VISIBLE_DEVICES"], "MIG-bbbb");
        for (key, value) in [
            ("RANK", "1"),
            ("LOCAL_RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "29500"),
        ] {
            assert_eq!(vars[key], value, "{key}");
        }
    }

    #[test]
    fn shared_devices_without_limit_stop_preallocation_and_cpu_means_no_gpu() {
        let job = JobEnv {
            job_id: "j".into(),
            devices: vec![AssignedDevice {
                cuda_id: String::new(),
                memory_total_bytes: None,
            }],
            exclusive: false,
            ..JobEnv::default()
        };
        let vars = process_env(&job, None, 0);
        assert_eq!(vars["CUDA_VISIBLE_DEVICES"], "");
        assert_eq!(vars["XLA_PYTHON_CLIENT_PREALLOCATE"], "false");
        assert_eq!(vars["TF_FORCE_GPU_ALLOW_GROWTH"], "true");
        assert!(!vars.contains_key("XLA_PYTHON_CLIENT_MEM_FRACTION"));
    }
}
