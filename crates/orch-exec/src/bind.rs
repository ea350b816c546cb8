//! Where a job's processes run and take their memory: the CPUs near their GPUs and the memory
//! of those CPUs' NUMA nodes (`[resources] cpu_bind = "numa"`).
//!
//! Design decision: each process binds itself between fork and exec, with `sched_setaffinity`
//! (its CPUs) and `set_mempolicy` (its memory), both inherited by everything it starts and kept
//! across exec. They need no privilege and no cgroup, cost a system call each, and bind each rank
//! of a per-device launch to its own GPU's node, which one cgroup for the whole job could not.
//! Where the job's own cgroup has the cpuset controller, it fences the same CPUs as well
//! ([`crate::cpuset`]).
//!
//! Memory is *preferred* from the nodes (`MPOL_PREFERRED_MANY`, Linux 5.15; `MPOL_PREFERRED` of
//! the first node before it), not bound (`MPOL_BIND`): a GPU job's host memory is mostly pinned
//! staging buffers and data-loader pages, and under `MPOL_BIND` a node that fills up means the
//! OOM killer for the job while the other node has memory free; preferred, the pages come from
//! the near node while it has room and from the far one after, slower but alive.
//!
//! The CPUs are never more than this process may use: the set asked for is intersected with the
//! CPUs online and orch's own affinity (which its cpuset bounds); the memory nodes are those
//! whose CPUs (`/sys/devices/system/node/nodeN/cpulist`) meet the bound CPUs, among the nodes
//! with memory and the ones orch may allocate from (`Mems_allowed_list`). The GPU's own NUMA
//! number is not used for memory: it names the node in the hardware's terms, and the CPUs are
//! what the kernel's node map is keyed by.

use orch_core::CpuList;
use std::path::Path;

/// What one process is bound to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuBinding {
    /// The CPUs it may run on; never empty.
    pub cpus: CpuList,
    /// The NUMA nodes its memory is preferred from; empty when the machine has no node map
    /// (then only the CPUs are bound).
    pub mems: CpuList,
}

impl std::fmt::Display for CpuBinding {
    /// `CPUs 0-23, memory preferred on NUMA node 0`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CPUs {}", self.cpus)?;
        match self.mems.len() {
            0 => Ok(()),
            1 => write!(f, ", memory preferred on NUMA node {}", self.mems),
            _ => write!(f, ", memory preferred on NUMA nodes {}", self.mems),
        }
    }
}

/// What this machine allows this process, read once per job.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostCpus {
    /// The CPUs this process may run on: online, and in its affinity (its cpuset's).
    pub usable: CpuList,
    /// Each NUMA node's CPUs, by node number.
    pub nodes: Vec<(u32, CpuList)>,
    /// The nodes this process may take memory from: nodes with memory, in `Mems_allowed_list`.
    pub memory_nodes: CpuList,
}

impl HostCpus {
    /// Reads `/sys/devices/system/{cpu,node}` and this process's affinity and `Mems_allowed`.
    pub fn read() -> HostCpus {
        HostCpus::read_from(
            Path::new("/sys/devices/system"),
            &own_affinity(),
            &own_mems(),
        )
    }

    /// As [`HostCpus::read`] with the system folder, the affinity and the allowed memory nodes
    /// given (tests).
    pub fn read_from(system: &Path, affinity: &CpuList, mems_allowed: &CpuList) -> HostCpus {
        let list = |path: &Path| -> Option<CpuList> {
            std::fs::read_to_string(path).ok()?.trim().parse().ok()
        };
        let online = list(&system.join("cpu/online"));
        let usable = match online {
            Some(online) => affinity.intersection(&online),
            None => affinity.clone(),
        };
        let node_dir = system.join("node");
        let mut nodes: Vec<(u32, CpuList)> = std::fs::read_dir(&node_dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|entry| {
                let name = entry.file_name();
                let number: u32 = name.to_str()?.strip_prefix("node")?.parse().ok()?;
                Some((number, list(&entry.path().join("cpulist"))?))
            })
            .collect();
        nodes.sort_by_key(|(n, _)| *n);
        let with_memory = list(&node_dir.join("has_memory"))
            .unwrap_or_else(|| CpuList::from_cpus(nodes.iter().map(|(n, _)| *n)));
        HostCpus {
            usable,
            nodes,
            memory_nodes: with_memory.intersection(mems_allowed),
        }
    }

    /// The CPUs of NUMA node `node`, when the machine has it.
    pub fn node_cpus(&self, node: u32) -> Option<&CpuList> {
        self.nodes.iter().find(|(n, _)| *n == node).map(|(_, c)| c)
    }

    /// The binding to `near` (the CPUs close to a process's GPUs): those of them this process
    /// may use, and the memory nodes of those CPUs. `Err` says why nothing can be bound.
    pub fn binding(&self, near: &CpuList) -> Result<CpuBinding, String> {
        let cpus = near.intersection(&self.usable);
        if cpus.is_empty() {
            return Err(format!(
                "none of the GPUs' CPUs ({near}) is among the CPUs orch may use here ({})",
                self.usable
            ));
        }
        let mems = CpuList::from_cpus(
            self.nodes
                .iter()
                .filter(|(_, node_cpus)| !node_cpus.intersection(&cpus).is_empty())
                .map(|(n, _)| *n),
        )
        .intersection(&self.memory_nodes);
        Ok(CpuBinding { cpus, mems })
    }
}

/// This process's CPU affinity (all CPUs up to the kernel's limit when it cannot be read).
fn own_affinity() -> CpuList {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; sched_getaffinity fills it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: `set` is a cpu_set_t of `size` bytes that lives across the call.
    if unsafe { libc::sched_getaffinity(0, size, &mut set) } != 0 {
        return CpuList::from_cpus(0..=orch_core::cpulist::MAX_CPU.min(size as u32 * 8 - 1));
    }
    let max = (size * 8) as u32;
    // SAFETY: CPU_ISSET reads the set within its size.
    CpuList::from_cpus((0..max).filter(|&cpu| unsafe { libc::CPU_ISSET(cpu as usize, &set) }))
}

/// The memory nodes this process may allocate from (`Mems_allowed_list`); node 0 alone when
/// the status cannot be read.
fn own_mems() -> CpuList {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("Mems_allowed_list:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or_else(|| CpuList::from_cpus([0]))
}

/// A binding made ready before the fork: the child only makes the system calls.
#[derive(Clone)]
pub(crate) struct PreparedBinding {
    cpus: libc::cpu_set_t,
    /// The memory nodes as the kernel's bit mask; empty: no memory policy.
    nodes: Vec<libc::c_ulong>,
    /// The first node, for kernels without `MPOL_PREFERRED_MANY`.
    first_node: Vec<libc::c_ulong>,
}

impl std::fmt::Debug for PreparedBinding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreparedBinding").finish_non_exhaustive()
    }
}

/// `MPOL_PREFERRED_MANY` (Linux 5.15), which the libc crate does not name.
const MPOL_PREFERRED_MANY: libc::c_int = 5;

impl PreparedBinding {
    pub(crate) fn new(binding: &CpuBinding) -> PreparedBinding {
        // SAFETY: a zeroed cpu_set_t is a valid empty set.
        let mut cpus: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        let max = std::mem::size_of::<libc::cpu_set_t>() * 8;
        for cpu in binding.cpus.iter().map(|c| c as usize).filter(|&c| c < max) {
            // SAFETY: `cpu` is below the set's size.
            unsafe { libc::CPU_SET(cpu, &mut cpus) };
        }
        let mask = |nodes: &mut dyn Iterator<Item = u32>| -> Vec<libc::c_ulong> {
            let bits = libc::c_ulong::BITS as usize;
            let mut words: Vec<libc::c_ulong> = Vec::new();
            for node in nodes {
                let (word, bit) = (node as usize / bits, node as usize % bits);
                if words.len() <= word {
                    words.resize(word + 1, 0);
                }
                words[word] |= 1 << bit;
            }
            words
        };
        PreparedBinding {
            cpus,
            nodes: mask(&mut binding.mems.iter()),
            first_node: mask(&mut binding.mems.iter().take(1)),
        }
    }

    /// Binds the calling process (between fork and exec: system calls only, no allocation).
    /// The CPUs must take; the memory policy is best effort (a kernel without NUMA refuses it).
    pub(crate) fn apply(&self) -> std::io::Result<()> {
        // SAFETY: the set lives in the caller's prepared data; the calls only read it.
        unsafe {
            if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &self.cpus) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if !self.nodes.is_empty() {
                let set = |mode: libc::c_int, mask: &[libc::c_ulong]| {
                    // The kernel reads maxnode - 1 bits.
                    let maxnode =
                        mask.len() as libc::c_ulong * libc::c_ulong::from(libc::c_ulong::BITS) + 1;
                    libc::syscall(libc::SYS_set_mempolicy, mode, mask.as_ptr(), maxnode)
                };
                if set(MPOL_PREFERRED_MANY, &self.nodes) != 0 {
                    set(libc::MPOL_PREFERRED, &self.first_node);
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake `/sys/devices/system` of two nodes: node 0 has CPUs 0-3, node 1 CPUs 4-7 and no
    /// memory of its own.
    fn system(tag: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("orch-bind-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for (path, text) in [
            ("cpu/online", "0-7\n"),
            ("node/node0/cpulist", "0-3\n"),
            ("node/node1/cpulist", "4-7\n"),
            ("node/has_memory", "0\n"),
        ] {
            let path = dir.join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        dir
    }

    #[test]
    fn binds_the_near_cpus_orch_may_use_and_their_nodes_memory() {
        let dir = system("near");
        let all = "0-7".parse().unwrap();
        let host = HostCpus::read_from(&dir, &all, &"0-1".parse().unwrap());
        assert_eq!(host.node_cpus(1), Some(&"4-7".parse().unwrap()));
        let b = host.binding(&"2-5".parse().unwrap()).unwrap();
        assert_eq!(b.cpus.to_string(), "2-5");
        // Node 1 has no memory: only node 0's is preferred.
        assert_eq!(b.mems.to_string(), "0");
        assert_eq!(b.to_string(), "CPUs 2-5, memory preferred on NUMA node 0");
        // orch itself may use CPUs 0-4 only (its cpuset): never more.
        let host = HostCpus::read_from(&dir, &"0-4".parse().unwrap(), &"0".parse().unwrap());
        assert_eq!(
            host.binding(&"4-7".parse().unwrap())
                .unwrap()
                .cpus
                .to_string(),
            "4"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn cpus_outside_orchs_own_are_refused_with_a_sentence() {
        let dir = system("outside");
        let host = HostCpus::read_from(&dir, &"0-3".parse().unwrap(), &"0".parse().unwrap());
        let why = host.binding(&"4-7".parse().unwrap()).unwrap_err();
        assert_eq!(
            why,
            "none of the GPUs' CPUs (4-7) is among the CPUs orch may use here (0-3)"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_forked_child_takes_its_binding() {
        let cpu = own_affinity().iter().last().unwrap();
        let binding = PreparedBinding::new(&CpuBinding {
            cpus: CpuList::from_cpus([cpu]),
            mems: own_mems(),
        });
        use std::os::unix::process::CommandExt;
        let mut command = std::process::Command::new("grep");
        command.args(["Cpus_allowed_list", "/proc/self/status"]);
        // SAFETY: apply makes system calls only.
        unsafe {
            command.pre_exec(move || binding.apply());
        }
        let out = command.output().unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout)
                .split_whitespace()
                .last(),
            Some(cpu.to_string().as_str())
        );
    }
}
