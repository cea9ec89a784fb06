//! The worker's modules depend on each other one way only, in the layers `worker/lib.rs` draws:
//! configuration ← queue ← registry ← what runs over the kinds ← runtime ← CLI. A `crate::`
//! reference that closes a cycle, or reaches up a layer, fails this test, naming it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The top-level modules each module of `dir` refers to through `crate::…`.
fn dependencies(dir: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let lib = std::fs::read_to_string(dir.join("lib.rs")).unwrap();
    let modules: BTreeSet<String> = lib
        .lines()
        .filter_map(|l| l.trim().strip_prefix("pub mod "))
        .map(|m| m.trim_end_matches(';').to_owned())
        .collect();
    let mut graph = BTreeMap::new();
    for module in &modules {
        let mut sources = Vec::new();
        let file = dir.join(format!("{module}.rs"));
        let folder = dir.join(module);
        if file.exists() {
            sources.push(std::fs::read_to_string(file).unwrap());
        }
        if folder.is_dir() {
            for entry in std::fs::read_dir(folder).unwrap() {
                sources.push(std::fs::read_to_string(entry.unwrap().path()).unwrap());
            }
        }
        assert!(!sources.is_empty(), "no source for module {module}");
        let mut used = BTreeSet::new();
        for source in sources {
            for line in source.lines().map(str::trim) {
                if line.starts_with("//") {
                    continue;
                }
                for (i, _) in line.match_indices("crate::") {
                    for name in referenced(&line[i + "crate::".len()..]) {
                        if modules.contains(&name) && &name != module {
                            used.insert(name);
                        }
                    }
                }
            }
        }
        graph.insert(module.clone(), used);
    }
    graph
}

/// The first path segments after `crate::`: `a::b` gives `a`, `{a, b::c}` gives `a` and `b`.
fn referenced(rest: &str) -> Vec<String> {
    let ident = |s: &str| -> String {
        s.trim()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    match rest.strip_prefix('{') {
        Some(group) => {
            let group = group.split('}').next().unwrap_or_default();
            group
                .split(',')
                .map(ident)
                .filter(|s| !s.is_empty())
                .collect()
        }
        None => vec![ident(rest)],
    }
}

/// A cycle in `graph`, if there is one, as the modules along it.
fn cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(start) = path.iter().position(|n| n == node) {
            let mut cycle = path[start..].to_vec();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

/// The worker's layers, lowest first, as `worker/lib.rs` lists them: a module uses modules of
/// its own layer (one way: no cycle) or of a lower one, never of a higher one.
const LAYERS: &[(&str, &[&str])] = &[
    (
        "configuration, and what needs nothing above it",
        &[
            "config",
            "clock",
            "context",
            "db",
            "doctor",
            "event",
            "holds",
            "http",
            "ledger",
            "receipts",
            "restarts",
            "schedule",
            "seed",
            "telemetry",
            "text",
            "wakeups",
        ],
    ),
    ("the queue and one hop off it", &["queue", "hop"]),
    ("the job kinds", &["registry"]),
    (
        "what runs over the kinds",
        &[
            "tick",
            "erase",
            "status",
            "status_page",
            "explain",
            "gauges",
            "generated",
            "orphans",
            "preview",
            "sessions",
            "traces",
        ],
    ),
    ("the runtime", &["worker"]),
    ("the CLI", &["demo", "cli"]),
];

#[test]
fn architecture_worker_modules_depend_one_way() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("worker");
    let graph = dependencies(&dir);
    if let Some(cycle) = cycle(&graph) {
        panic!("module cycle: {}", cycle.join(" -> "));
    }
    let layer = |module: &str| {
        LAYERS
            .iter()
            .position(|(_, modules)| modules.contains(&module))
            .unwrap_or_else(|| panic!("module {module} is in none of LAYERS: give it its layer"))
    };
    for (module, used) in &graph {
        for dependency in used {
            assert!(
                layer(dependency) <= layer(module),
                "{module} ({}) must not depend on {dependency} ({})",
                LAYERS[layer(module)].0,
                LAYERS[layer(dependency)].0
            );
        }
    }
}

#[test]
fn architecture_the_cycle_check_finds_a_cycle() {
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec![]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.into_iter().map(str::to_owned).collect()))
    .collect();
    assert_eq!(cycle(&graph).unwrap(), ["a", "b", "c", "a"]);
    assert_eq!(
        referenced("{db, ledger::x, queue}; "),
        ["db", "ledger", "queue"]
    );
}
