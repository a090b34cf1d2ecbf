//! The machine a run measured, recorded with every result: figures from different machines,
//! or from one machine whose frequency governor changed, must not be compared blindly.

use serde::Serialize;

/// What is known of this machine; fields that cannot be read say so.
#[derive(Debug, Clone, Serialize)]
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
    /// qsm-stand's version (the codecs' crate versions are in Cargo.lock at that version).
    pub version: &'static str,
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
        let numa_nodes = std::fs::read_dir("/sys/devices/system/node")
            .map(|d| {
                d.filter_map(Result::ok)
                    .filter(|e| {
                        let name = e.file_name();
                        let name = name.to_string_lossy();
                        name.strip_prefix("node").is_some_and(|n| n.parse::<u32>().is_ok())
                    })
                    .count()
            })
            .unwrap_or(0)
            .max(1);
        Environment {
            cpu_model,
            cores: crate::load::cpus().len(),
            governor: read("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor")
                .unwrap_or_else(|| "unknown".into()),
            numa_nodes,
            page_size: rustix::param::page_size() as u64,
            kernel: read("/proc/sys/kernel/osrelease").unwrap_or_else(|| "unknown".into()),
            version: env!("CARGO_PKG_VERSION"),
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
    }
}
