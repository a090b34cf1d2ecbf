//! The machine a run measured, recorded with every result: figures from different machines,
//! or from one machine whose frequency governor changed, must not be compared blindly.

use serde::{Deserialize, Serialize};

/// What is known of this machine; fields that cannot be read say so.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Environment {
    /// `model name` from /proc/cpuinfo.
    pub cpu_model: String,
    /// Cores this process may run on.
    pub cores: usize,
    /// cpu0's frequency governor, or "unknown" (virtual machines often hide it).
    pub governor: String,
    /// NUMA nodes (`/sys/devices/system/node/node*`); 1 means the memory load is a bandwidth
    /// load, not an interconnect one.
    pub numa_nodes: usize,
    /// Bytes per page.
    pub page_size: u64,
    /// Kernel release.
    pub kernel: String,
    /// qsm-stand's version.
    pub version: String,
    /// The crates whose code was measured, with their versions (from Cargo.lock at build).
    pub crates: std::collections::BTreeMap<String, String>,
}

mod built {
    include!(concat!(env!("OUT_DIR"), "/crates.rs"));
}

fn read(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok().map(|s| s.trim().to_owned()).filter(|s| !s.is_empty())
}

impl Environment {
    /// Reads it from /proc and /sys.
    pub fn probe() -> Environment {
        let cpu_model = read("/proc/cpuinfo")
            .and_then(|c| {
                c.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, v)| v.trim().to_owned())
            })
            .unwrap_or_else(|| "unknown".into());
        let numa_nodes = crate::numa::nodes().len();
        Environment {
            cpu_model,
            cores: crate::load::cpus().len(),
            governor: read("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor")
                .unwrap_or_else(|| "unknown".into()),
            numa_nodes,
            page_size: rustix::param::page_size() as u64,
            kernel: read("/proc/sys/kernel/osrelease").unwrap_or_else(|| "unknown".into()),
            version: env!("CARGO_PKG_VERSION").into(),
            crates: built::CRATES.iter().map(|&(n, v)| (n.into(), v.into())).collect(),
        }
    }

    /// One line for reports.
    pub fn line(&self) -> String {
        format!(
            "{}, {} cores, governor {}, {} NUMA node{}, {}-byte pages, Linux {}, qsm-stand {}",
            self.cpu_model,
            self.cores,
            self.governor,
            self.numa_nodes,
            if self.numa_nodes == 1 { "" } else { "s" },
            self.page_size,
            self.kernel,
            self.version
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_machine_is_described() {
        let e = Environment::probe();
        assert!(e.cores >= 1 && e.numa_nodes >= 1);
        assert!(e.page_size.is_power_of_two() && e.page_size >= 4096, "{}", e.page_size);
        assert!(!e.kernel.is_empty() && e.line().contains("cores"), "{}", e.line());
        assert!(e.crates.contains_key("aws-lc-rs") && e.crates.contains_key("zstd"), "{e:?}");
    }
}
