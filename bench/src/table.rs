//! Markdown as latest.md is written: tables of figures under short column names, and a table
//! of the facts a section's figures were measured under. What each column means is in
//! docs/benchmark.md.

/// A markdown table of `header` and `rows`.
pub fn table(header: &[&str], rows: impl IntoIterator<Item = Vec<String>>) -> String {
    let mut md = format!(
        "| {} |\n|{}\n",
        header.join(" | "),
        "---|".repeat(header.len())
    );
    for row in rows {
        md.push_str(&format!("| {} |\n", row.join(" | ")));
    }
    md
}

/// A column of a table whose rows are each an item `B` within its group `A` (a method at its
/// scale, say): its heading, and how a row's cell is written.
pub type Column<A, B> = (&'static str, fn(&A, &B) -> String);

/// A markdown table of `rows`, a column each of `columns`.
pub fn columns<A, B>(columns: &[Column<A, B>], rows: &[(&A, &B)]) -> String {
    let header: Vec<&str> = columns.iter().map(|(heading, _)| *heading).collect();
    let cells = |(a, b): &(&A, &B)| columns.iter().map(|(_, cell)| cell(a, b)).collect();
    table(&header, rows.iter().map(cells))
}

/// Every item of every group, as [`columns`] takes its rows.
pub fn within<'a, A, B: 'a>(
    groups: &'a [A],
    items: impl Fn(&'a A) -> &'a [B],
) -> Vec<(&'a A, &'a B)> {
    groups
        .iter()
        .flat_map(|group| items(group).iter().map(move |item| (group, item)))
        .collect()
}

/// Each item in a group of its own, `()`, as [`columns`] takes the rows of a flat table.
pub fn flat<B>(items: &[B]) -> Vec<(&(), &B)> {
    items.iter().map(|item| (&(), item)).collect()
}

/// A figure with `decimals` decimals.
pub fn f(value: f64, decimals: usize) -> String {
    format!("{value:.decimals$}")
}

/// The facts a section was measured under, a row each.
pub fn facts(rows: &[(&str, String)]) -> String {
    table(
        &["fact", "value"],
        rows.iter()
            .map(|(fact, value)| vec![(*fact).to_owned(), value.clone()]),
    )
}

/// When and where a part ran: the date, the machine, and whether with the scales or on its own
/// (`--only`).
pub fn measured(at: &chrono::DateTime<chrono::Utc>, machine: &str, with_scales: bool) -> String {
    let run = if with_scales {
        "with the scales"
    } else {
        "on its own (`--only`)"
    };
    format!("{}, {machine}, {run}", at.format("%Y-%m-%d"))
}

/// `value` formatted by `f`, or "—" when there is none.
pub fn or_dash<T>(value: Option<T>, f: impl FnOnce(T) -> String) -> String {
    value.map_or_else(|| "—".to_owned(), f)
}

/// Kilobytes as megabytes with one decimal, or "—".
pub fn mb(kb: Option<u64>) -> String {
    or_dash(kb, |kb| format!("{:.1}", kb as f64 / 1024.0))
}

/// A share as a whole percentage, or "—".
pub fn percent(share: Option<f64>) -> String {
    or_dash(share, |x| format!("{:.0}%", x * 100.0))
}
