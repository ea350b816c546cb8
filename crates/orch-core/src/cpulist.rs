//! Sets of CPUs in the Linux list format (`0-47,96-143`), as `/sys/devices/system/node/nodeN/cpulist`,
//! `Cpus_allowed_list` in `/proc/PID/status` and `cpuset.cpus` write them.
//!
//! Kept as sorted, disjoint, non-adjacent ranges, so a 2-socket box of 192 CPUs is two pairs and
//! equality is equality of sets.

use serde::de::{self, Deserializer};
use serde::{Deserialize, Serialize, Serializer};
use std::fmt;
use std::str::FromStr;

/// The highest CPU number accepted: Linux's largest `NR_CPUS` (`CONFIG_MAXSMP`) is 8192.
pub const MAX_CPU: u32 = 8191;

/// A set of CPU numbers.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct CpuList {
    /// Inclusive ranges, sorted, disjoint and not touching.
    ranges: Vec<(u32, u32)>,
}

/// Why a CPU list was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "expected a CPU list such as \"0-47,96-143\" (CPU numbers 0 to {MAX_CPU}, ranges low-high), found \"{0}\""
)]
pub struct CpuListError(pub String);

impl CpuList {
    /// The set of the given CPUs.
    pub fn from_cpus(cpus: impl IntoIterator<Item = u32>) -> CpuList {
        let mut list = CpuList::default();
        for cpu in cpus {
            list.insert_range(cpu, cpu);
        }
        list
    }

    /// Whether no CPU is in the set.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// How many CPUs are in the set.
    pub fn len(&self) -> usize {
        self.ranges
            .iter()
            .map(|&(lo, hi)| (hi - lo) as usize + 1)
            .sum()
    }

    pub fn contains(&self, cpu: u32) -> bool {
        self.ranges.iter().any(|&(lo, hi)| (lo..=hi).contains(&cpu))
    }

    /// The CPUs in increasing order.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.ranges.iter().flat_map(|&(lo, hi)| lo..=hi)
    }

    /// The inclusive ranges, in increasing order.
    pub fn ranges(&self) -> &[(u32, u32)] {
        &self.ranges
    }

    /// The CPUs in either set.
    pub fn union(&self, other: &CpuList) -> CpuList {
        let mut out = self.clone();
        for &(lo, hi) in &other.ranges {
            out.insert_range(lo, hi);
        }
        out
    }

    /// The CPUs in both sets.
    pub fn intersection(&self, other: &CpuList) -> CpuList {
        let mut out = CpuList::default();
        for &(a_lo, a_hi) in &self.ranges {
            for &(b_lo, b_hi) in &other.ranges {
                let (lo, hi) = (a_lo.max(b_lo), a_hi.min(b_hi));
                if lo <= hi {
                    out.insert_range(lo, hi);
                }
            }
        }
        out
    }

    fn insert_range(&mut self, lo: u32, hi: u32) {
        let (mut lo, mut hi) = (lo.min(hi), lo.max(hi));
        let mut kept = Vec::with_capacity(self.ranges.len() + 1);
        for &(a, b) in &self.ranges {
            // Merge what overlaps or touches the new range.
            if b.saturating_add(1) >= lo && a <= hi.saturating_add(1) {
                lo = lo.min(a);
                hi = hi.max(b);
            } else {
                kept.push((a, b));
            }
        }
        kept.push((lo, hi));
        kept.sort_unstable();
        self.ranges = kept;
    }
}

impl FromStr for CpuList {
    type Err = CpuListError;

    /// Parses `0-3,8,10-11`; an empty (or all-blank) string is the empty set, as the kernel
    /// writes an empty `cpulist` for a node without CPUs.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || CpuListError(s.to_string());
        let number = |t: &str| -> Result<u32, CpuListError> {
            let t = t.trim();
            if t.is_empty() || !t.bytes().all(|c| c.is_ascii_digit()) {
                return Err(err());
            }
            let n: u32 = t.parse().map_err(|_| err())?;
            if n > MAX_CPU {
                return Err(err());
            }
            Ok(n)
        };
        let mut list = CpuList::default();
        if s.trim().is_empty() {
            return Ok(list);
        }
        for part in s.trim().split(',') {
            let (lo, hi) = match part.split_once('-') {
                Some((lo, hi)) => (number(lo)?, number(hi)?),
                None => {
                    let n = number(part)?;
                    (n, n)
                }
            };
            if lo > hi {
                return Err(err());
            }
            list.insert_range(lo, hi);
        }
        Ok(list)
    }
}

impl fmt::Display for CpuList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, &(lo, hi)) in self.ranges.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            if lo == hi {
                write!(f, "{lo}")?;
            } else {
                write!(f, "{lo}-{hi}")?;
            }
        }
        Ok(())
    }
}

impl Serialize for CpuList {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for CpuList {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_the_kernel_format() {
        let list: CpuList = "0-47,96-143".parse().unwrap();
        assert_eq!(list.len(), 96);
        assert!(list.contains(0) && list.contains(47) && list.contains(96));
        assert!(!list.contains(48) && !list.contains(144));
        assert_eq!(list.to_string(), "0-47,96-143");
        let merged: CpuList = "3, 1-2,0,8,9-9,5-6".parse().unwrap();
        assert_eq!(merged.to_string(), "0-3,5-6,8-9");
        assert_eq!("".parse::<CpuList>().unwrap(), CpuList::default());
        assert_eq!(CpuList::from_cpus([4, 2, 3]).to_string(), "2-4");
    }

    #[test]
    fn refuses_what_the_kernel_would_not_write() {
        for bad in [
            "a",
            "1-",
            "-1",
            "3-1",
            "1,,2",
            "8192",
            "0-99999999999",
            "1 2",
            "+1",
        ] {
            let err = bad.parse::<CpuList>().unwrap_err();
            assert!(err.to_string().contains("0-47,96-143"), "{err}");
        }
    }

    #[test]
    fn union_and_intersection_are_set_operations() {
        let a: CpuList = "0-3,8-11".parse().unwrap();
        let b: CpuList = "2-9".parse().unwrap();
        assert_eq!(a.union(&b).to_string(), "0-11");
        assert_eq!(a.intersection(&b).to_string(), "2-3,8-9");
        let json = serde_json::to_string(&a).unwrap();
        assert_eq!(json, "\"0-3,8-11\"");
        assert_eq!(serde_json::from_str::<CpuList>(&json).unwrap(), a);
    }
}
