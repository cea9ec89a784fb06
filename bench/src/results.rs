//! The results files, `latest.json` and `latest.md` under `--out`: each part's figures and
//! section written in, the other parts' kept as the files hold them.

use anyhow::{Context as _, bail};
use chrono::Utc;
use serde::Serialize;

use crate::{Cli, attachments, expiry, scales, tenants, traces};

/// What a run writes: the scales measured so far, the short-lived records, the run traces
/// measured so far, the attachment bytes, or the many accounts' nights.
pub enum Section<'a> {
    Scales(&'a [scales::Scale]),
    Expiry(&'a expiry::Expiry),
    Traces(&'a traces::Traces),
    Attachments(&'a attachments::Attachments),
    Tenants(&'a tenants::Tenants),
}

/// The headed sections of latest.md, in their order there, after the scales' tables (which
/// have no heading of their own).
const HEADINGS: [&str; 4] = [
    expiry::EXPIRY_HEADING,
    traces::TRACES_HEADING,
    attachments::ATTACHMENTS_HEADING,
    tenants::TENANTS_HEADING,
];

/// Writes `section` into latest.json (`scales`, `expiry`, `traces`, `attachments` or `tenants`) and
/// latest.md (the tables at the top, or the section under its heading of [`HEADINGS`]), keeping
/// what the files hold of the other parts.
pub fn write_results(cli: &Cli, section: Section<'_>) -> anyhow::Result<()> {
    std::fs::create_dir_all(&cli.out)?;
    let (json_path, md_path) = (cli.out.join("latest.json"), cli.out.join("latest.md"));
    let mut json = match std::fs::read_to_string(&json_path) {
        Ok(text) => json_members(&text)
            .with_context(|| format!("{} is not a JSON object", json_path.display()))?,
        Err(_) => Vec::new(),
    };
    let md = std::fs::read_to_string(&md_path).unwrap_or_default();
    // parts[0]: the scales' tables; parts[1 + i]: the section under HEADINGS[i].
    let mut starts: Vec<(usize, usize)> = HEADINGS
        .iter()
        .enumerate()
        .filter_map(|(i, heading)| {
            md.match_indices(heading)
                .map(|(at, _)| at)
                .find(|&at| at == 0 || md[..at].ends_with('\n'))
                .map(|at| (at, i + 1))
        })
        .collect();
    starts.sort();
    let mut parts = vec![String::new(); HEADINGS.len() + 1];
    parts[0] = md[..starts.first().map_or(md.len(), |(at, _)| *at)].to_owned();
    for (n, &(at, part)) in starts.iter().enumerate() {
        let end = starts.get(n + 1).map_or(md.len(), |(next, _)| *next);
        parts[part] = md[at..end].to_owned();
    }
    match section {
        Section::Scales(results) => {
            let machine = machine();
            set_member(&mut json, "machine", &machine)?;
            set_member(&mut json, "measured_at", &Utc::now().to_rfc3339())?;
            set_member(&mut json, "scales", results)?;
            set_member(&mut json, "targets", &scales::targets(results))?;
            parts[0] = format!(
                "Measured {} on {machine}.\n\n{}",
                Utc::now().format("%Y-%m-%d"),
                scales::markdown(results)
            );
        }
        Section::Expiry(e) => {
            set_member(&mut json, "expiry", e)?;
            parts[1] = expiry::markdown(e);
        }
        Section::Traces(t) => {
            set_member(&mut json, "traces", t)?;
            parts[2] = traces::markdown(t);
        }
        Section::Attachments(a) => {
            set_member(&mut json, "attachments", a)?;
            parts[3] = attachments::markdown(a);
        }
        Section::Tenants(t) => {
            set_member(&mut json, "tenants", t)?;
            parts[4] = tenants::markdown(t);
        }
    }
    let members: Vec<String> = json
        .iter()
        .map(|(key, value)| format!("  {}: {value}", serde_json::Value::from(key.as_str())))
        .collect();
    std::fs::write(&json_path, format!("{{\n{}\n}}", members.join(",\n")))?;
    let parts: Vec<&str> = parts
        .iter()
        .map(|part| part.trim_end())
        .filter(|part| !part.is_empty())
        .collect();
    std::fs::write(&md_path, parts.join("\n\n") + "\n")?;
    Ok(())
}

/// The members of a JSON object's text in order, each as its key and its value's text, as
/// written: parsing and printing them again would change the last digit of some figures.
fn json_members(text: &str) -> anyhow::Result<Vec<(String, String)>> {
    let object: serde_json::Value = serde_json::from_str(text)?;
    let count = object.as_object().context("not an object")?.len();
    let (mut members, mut depth, mut start) = (Vec::new(), 0, 0);
    let (mut in_string, mut escaped) = (false, false);
    for (i, b) in text.bytes().enumerate() {
        if in_string {
            (in_string, escaped) = match b {
                _ if escaped => (true, false),
                b'\\' => (true, true),
                b'"' => (false, false),
                _ => (true, false),
            };
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => {
                depth += 1;
                if depth == 1 {
                    start = i + 1;
                }
            }
            b'}' | b']' | b',' if depth == 1 => {
                let member = text[start..i].trim();
                if !member.is_empty() {
                    let mut key = serde_json::Deserializer::from_str(member).into_iter::<String>();
                    let name = key.next().context("a member without a key")??;
                    let value = member[key.byte_offset()..].trim_start();
                    let value = value.strip_prefix(':').context("a key without a value")?;
                    members.push((name, value.trim().to_owned()));
                }
                start = i + 1;
                if b != b',' {
                    depth -= 1;
                }
            }
            b'}' | b']' => depth -= 1,
            _ => {}
        }
    }
    if members.len() != count {
        bail!("{} members found of {count}", members.len());
    }
    Ok(members)
}

/// Sets member `key` of an object held as [`json_members`] to `value`, pretty-printed as a
/// member of the top level (appended if it is new).
fn set_member(
    members: &mut Vec<(String, String)>,
    key: &str,
    value: &(impl Serialize + ?Sized),
) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(value)?.replace('\n', "\n  ");
    match members.iter_mut().find(|(name, _)| name == key) {
        Some(member) => member.1 = text,
        None => members.push((key.to_owned(), text)),
    }
    Ok(())
}

/// The machine, as the results name it: cores and CPU model.
pub fn machine() -> String {
    format!(
        "{} cores, {}",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(
                |c| c.lines().find(|l| l.starts_with("model name")).map(|l| l
                    .split(':')
                    .nth(1)
                    .unwrap_or("")
                    .trim()
                    .to_owned())
            )
            .unwrap_or_default()
    )
}
