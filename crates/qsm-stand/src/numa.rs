//! The NUMA topology, read from `/sys/devices/system/node` (the libnuma crates are dead, and
//! sysfs is what libnuma reads anyway). A machine without that directory is one node.
//!
//! Memory is placed by first touch: Linux gives a page to the node of the CPU that first
//! writes it, so a buffer made by a thread pinned to a node's CPU lives on that node. That
//! needs no privilege and no `mbind`, and it is how the measurement places its data.

/// One NUMA node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// Its number.
    pub id: usize,
    /// Its online CPUs.
    pub cpus: Vec<usize>,
}

/// The nodes with their CPUs, in order; at least one.
pub fn nodes() -> Vec<Node> {
    let mut nodes: Vec<Node> = std::fs::read_dir("/sys/devices/system/node")
        .map(|dir| {
            dir.filter_map(Result::ok)
                .filter_map(|e| {
                    let id = e.file_name().to_str()?.strip_prefix("node")?.parse().ok()?;
                    let list = std::fs::read_to_string(e.path().join("cpulist")).ok()?;
                    Some(Node { id, cpus: parse_cpulist(&list) })
                })
                .collect()
        })
        .unwrap_or_default();
    nodes.sort_by_key(|n| n.id);
    if nodes.is_empty() {
        nodes.push(Node { id: 0, cpus: crate::load::cpus() });
    }
    nodes
}

/// The CPUs of `node` this process may use: empty for a memory-only node, or one the
/// process's cpuset excludes.
pub fn cpus_of(node: usize, allowed: &[usize]) -> Vec<usize> {
    nodes()
        .into_iter()
        .find(|n| n.id == node)
        .map(|n| n.cpus.into_iter().filter(|c| allowed.contains(c)).collect())
        .unwrap_or_default()
}

/// Parses a kernel CPU list (`0-3,8,10-11`); malformed parts are skipped.
pub fn parse_cpulist(text: &str) -> Vec<usize> {
    let mut out = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        let range = match part.split_once('-') {
            Some((a, b)) => a.parse::<usize>().ok().zip(b.parse::<usize>().ok()),
            None => part.parse::<usize>().ok().map(|a| (a, a)),
        };
        if let Some((a, b)) = range {
            out.extend(a..=b);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_parse_as_the_kernel_writes_them() {
        assert_eq!(parse_cpulist("0-3,8,10-11\n"), [0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(parse_cpulist(""), Vec::<usize>::new());
        assert_eq!(parse_cpulist("2,x,4"), [2, 4]);
    }

    #[test]
    fn this_machine_has_a_node_holding_a_usable_cpu() {
        let nodes = nodes();
        assert!(!nodes.is_empty());
        let allowed = crate::load::cpus();
        assert!(nodes.iter().any(|n| n.cpus.iter().any(|c| allowed.contains(c))), "{nodes:?}");
        assert!(!cpus_of(nodes[0].id, &allowed).is_empty());
    }
}
