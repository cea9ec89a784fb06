//! The results files, `latest.json` and `latest.md` under `--out`. A part's figures are written
//! in as members of latest.json, and its section of latest.md is rendered from the file as it
//! then stands; the other parts' members and sections are kept as the files hold them. The
//! parts are known here only as the [`Section`]s main hands over, in their order in latest.md.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use serde::Serialize;

/// How a section's body is rendered from the whole of latest.json: `None` when the file holds
/// none of its figures.
pub type Render = fn(&serde_json::Value) -> anyhow::Result<Option<String>>;

/// A section of latest.md: its heading, and how its body is rendered.
#[derive(Clone, Copy)]
pub struct Section {
    pub heading: &'static str,
    pub render: Render,
}

/// The results files under `--out`, with the sections of latest.md in their order.
pub struct Results {
    out: PathBuf,
    sections: Vec<Section>,
}

/// One part's handle on the results files: writes its members and re-renders its section.
#[derive(Clone, Copy)]
pub struct Report<'a> {
    results: &'a Results,
    section: usize,
}

impl Results {
    pub fn new(out: &Path, sections: Vec<Section>) -> Self {
        Self {
            out: out.to_owned(),
            sections,
        }
    }

    /// The handle of the section at `index` of those given to [`Results::new`].
    pub fn report(&self, index: usize) -> Report<'_> {
        Report {
            results: self,
            section: index,
        }
    }

    fn json_path(&self) -> PathBuf {
        self.out.join("latest.json")
    }

    fn md_path(&self) -> PathBuf {
        self.out.join("latest.md")
    }

    /// latest.json's members, as written (an empty list when there is no file yet).
    fn members(&self) -> anyhow::Result<Vec<(String, String)>> {
        let path = self.json_path();
        match std::fs::read_to_string(&path) {
            Ok(text) => json_members(&text)
                .with_context(|| format!("{} is not a JSON object", path.display())),
            Err(_) => Ok(Vec::new()),
        }
    }

    /// latest.md cut into the sections' texts, each from its heading on. Text before the first
    /// heading found belongs to the first section (written by a build whose first section had
    /// no heading), unless that section's heading is found.
    fn sections_text(&self) -> Vec<String> {
        let md = std::fs::read_to_string(self.md_path()).unwrap_or_default();
        let mut starts: Vec<(usize, usize)> = self
            .sections
            .iter()
            .enumerate()
            .filter_map(|(i, section)| {
                md.match_indices(section.heading)
                    .map(|(at, _)| at)
                    .find(|&at| {
                        (at == 0 || md[..at].ends_with('\n'))
                            && md[at + section.heading.len()..].starts_with('\n')
                    })
                    .map(|at| (at, i))
            })
            .collect();
        starts.sort();
        let mut texts = vec![String::new(); self.sections.len()];
        texts[0] = md[..starts.first().map_or(md.len(), |(at, _)| *at)].to_owned();
        for (n, &(at, section)) in starts.iter().enumerate() {
            let end = starts.get(n + 1).map_or(md.len(), |(next, _)| *next);
            texts[section] = md[at..end].to_owned();
        }
        texts
    }

    /// Writes latest.json from `members` and latest.md from `texts`, the sections in order.
    fn save(&self, members: &[(String, String)], texts: &[String]) -> anyhow::Result<()> {
        std::fs::create_dir_all(&self.out)?;
        let members: Vec<String> = members
            .iter()
            .map(|(key, value)| format!("  {}: {value}", serde_json::Value::from(key.as_str())))
            .collect();
        std::fs::write(self.json_path(), format!("{{\n{}\n}}", members.join(",\n")))?;
        let texts: Vec<&str> = texts
            .iter()
            .map(|text| text.trim_end())
            .filter(|text| !text.is_empty())
            .collect();
        std::fs::write(self.md_path(), texts.join("\n\n") + "\n")?;
        Ok(())
    }

    /// The section at `index`, heading and body, rendered from `members`.
    fn render(&self, index: usize, members: &[(String, String)]) -> anyhow::Result<Option<String>> {
        let text = format!(
            "{{{}}}",
            members
                .iter()
                .map(|(key, value)| format!("{}: {value}", serde_json::Value::from(key.as_str())))
                .collect::<Vec<_>>()
                .join(",")
        );
        let json: serde_json::Value = serde_json::from_str(&text)?;
        let section = self.sections[index];
        Ok((section.render)(&json)?.map(|body| format!("{}\n\n{body}", section.heading)))
    }

    /// The section at `index` as latest.json now renders it, if it holds its figures.
    pub fn section(&self, index: usize) -> anyhow::Result<Option<String>> {
        self.render(index, &self.members()?)
    }

    /// Writes latest.md anew from latest.json: every section whose figures the file holds.
    pub fn render_all(&self) -> anyhow::Result<()> {
        let members = self.members()?;
        if members.is_empty() {
            bail!("{} holds no figures to render", self.json_path().display());
        }
        let mut texts = Vec::new();
        for index in 0..self.sections.len() {
            texts.push(self.render(index, &members)?.unwrap_or_default());
        }
        self.save(&members, &texts)
    }
}

impl Report<'_> {
    /// Sets `members` of latest.json (each a [`member`], appended if new) and renders this
    /// part's section of latest.md from the file as it then stands.
    pub fn write(&self, members: &[(&str, String)]) -> anyhow::Result<()> {
        let results = self.results;
        let mut json = results.members()?;
        for (key, text) in members {
            set_member(&mut json, key, text);
        }
        let mut texts = results.sections_text();
        texts[self.section] = results
            .render(self.section, &json)?
            .context("a section that renders nothing from the figures just written")?;
        results.save(&json, &texts)
    }
}

/// `value` as a member of latest.json's top level: pretty-printed, indented once.
pub fn member(value: &(impl Serialize + ?Sized)) -> anyhow::Result<String> {
    Ok(serde_json::to_string_pretty(value)?.replace('\n', "\n  "))
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

/// Sets member `key` of an object held as [`json_members`] to `text`, a member's pretty-printed
/// value (appended if it is new).
fn set_member(members: &mut Vec<(String, String)>, key: &str, text: &str) {
    match members.iter_mut().find(|(name, _)| name == key) {
        Some(member) => text.clone_into(&mut member.1),
        None => members.push((key.to_owned(), text.to_owned())),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn render_a(json: &serde_json::Value) -> anyhow::Result<Option<String>> {
        Ok(json.get("a").map(|a| format!("a is {a}")))
    }

    fn render_b(json: &serde_json::Value) -> anyhow::Result<Option<String>> {
        Ok(json.get("b").map(|b| format!("b is {b}")))
    }

    fn results(dir: &Path) -> Results {
        let sections = vec![
            Section {
                heading: "## A",
                render: render_a,
            },
            Section {
                heading: "## B",
                render: render_b,
            },
        ];
        Results::new(dir, sections)
    }

    #[test]
    fn a_part_written_alone_keeps_the_other_parts_members_and_sections_as_written() {
        let dir = std::env::temp_dir().join(format!("sexton-bench-results-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // As an earlier build wrote them: a figure whose last digit a reprint would change, and
        // the first section without its heading.
        std::fs::write(
            dir.join("latest.json"),
            "{\n  \"a\": 0.30000000000000004\n}",
        )
        .unwrap();
        std::fs::write(dir.join("latest.md"), "the first part, as written\n").unwrap();
        let results = results(&dir);
        results
            .report(1)
            .write(&[("b", member(&2).unwrap())])
            .unwrap();
        let json = std::fs::read_to_string(dir.join("latest.json")).unwrap();
        assert_eq!(json, "{\n  \"a\": 0.30000000000000004,\n  \"b\": 2\n}");
        let md = std::fs::read_to_string(dir.join("latest.md")).unwrap();
        assert_eq!(md, "the first part, as written\n\n## B\n\nb is 2\n");
        // Written again, the first part's section is rendered in its place, the second kept.
        results
            .report(0)
            .write(&[("a", member(&1).unwrap())])
            .unwrap();
        let md = std::fs::read_to_string(dir.join("latest.md")).unwrap();
        assert_eq!(md, "## A\n\na is 1\n\n## B\n\nb is 2\n");
        results.render_all().unwrap();
        assert_eq!(std::fs::read_to_string(dir.join("latest.md")).unwrap(), md);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
