//! An object-store root before the first night (OP-7): its bucket listed, then the bucket's
//! versioning against its lifecycle rules. A bucket that keeps versions turns each delete into
//! a delete marker over the old bytes: unless a lifecycle rule expires noncurrent versions,
//! what sexton removes would stay, only hidden.

use quick_xml::events::Event;
use serde::Deserialize;
use serde::de::{DeserializeOwned, IgnoredAny};
use sexton_jobs::files::object::{BucketAnswer, ObjectRoot};

use super::Check;

/// The root's lines: the listing's, and once the bucket lists, its versioning's.
pub(super) async fn root(name: &str, objects: &ObjectRoot) -> Vec<Check> {
    let check = format!("root {name}");
    if let Err(why) = objects.reach().await {
        return vec![Check::finding(
            check,
            format!("{objects} cannot be listed: {why}"),
            "check [storage] (endpoint, credentials) and the bucket policy: sexton lists, \
             reads, and deletes objects under the prefix",
        )];
    }
    vec![
        Check::ok(check, format!("{objects} listed")),
        versioning(format!("versioning {name}"), objects).await,
    ]
}

/// The bucket's versioning, and with it on, the lifecycle rules that expire old versions.
async fn versioning(check: String, objects: &ObjectRoot) -> Check {
    let bucket = objects.bucket();
    let cannot = |what: &str, permission: &str, why: String| {
        Check::finding(
            check.clone(),
            format!("bucket {bucket}: its {what} cannot be read: {why}"),
            format!(
                "allow {permission} on arn:aws:s3:::{bucket} to sexton's credentials (a bucket \
                 that keeps versions keeps what sexton removes, and only this tells)"
            ),
        )
    };
    let status = match read::<Versioning>(objects.bucket_config("versioning").await) {
        Read::Config(versioning) => versioning.status,
        Read::NotImplemented(why) => {
            return Check::ok(
                check,
                format!(
                    "bucket {bucket}: the store does not report versioning (GetBucketVersioning: \
                     {why})"
                ),
            );
        }
        Read::NoConfiguration(why) | Read::Failed(why) => {
            return cannot("versioning", "s3:GetBucketVersioning", why);
        }
    };
    match status.as_deref() {
        Some("Enabled") => {}
        Some("Suspended") => {
            return Check::ok(
                check,
                format!(
                    "bucket {bucket}: versioning suspended, a removed object is gone (versions \
                     kept while it was on stay until removed)"
                ),
            );
        }
        _ => return Check::ok(check, format!("bucket {bucket}: versioning off")),
    }
    let under = match objects.prefix() {
        "" => "the whole bucket".to_owned(),
        prefix => format!("{prefix}/"),
    };
    let fix = format!(
        "add a lifecycle rule to {bucket} with NoncurrentVersionExpiration (NoncurrentDays, no \
         NewerNoncurrentVersions) whose filter covers {under}, or suspend versioning"
    );
    let rules = match read::<Lifecycle>(objects.bucket_config("lifecycle").await) {
        Read::Config(lifecycle) => lifecycle.rules,
        Read::NoConfiguration(_) => Vec::new(),
        Read::NotImplemented(why) => {
            return Check::finding(
                check,
                format!(
                    "bucket {bucket}: versioning on, and the store does not report lifecycle \
                     rules ({why}): removed objects may stay as old versions"
                ),
                fix,
            );
        }
        Read::Failed(why) => {
            return cannot("lifecycle rules", "s3:GetLifecycleConfiguration", why);
        }
    };
    match expiring(&rules, objects.prefix()) {
        Ok(rule) => Check::ok(check, format!("bucket {bucket}: versioning on; {rule}")),
        Err(notes) => {
            let notes = if notes.is_empty() {
                String::new()
            } else {
                format!(" ({})", notes.join("; "))
            };
            Check::finding(
                check,
                format!(
                    "bucket {bucket}: versioning on and no lifecycle rule expires noncurrent \
                     versions under {under}{notes}: removed objects would stay as old versions: \
                     retention and erasure would only hide them"
                ),
                fix,
            )
        }
    }
}

/// A rule that expires every noncurrent version under `prefix` (what it does, for people), or
/// why each rule that expires noncurrent versions does not.
fn expiring(rules: &[Rule], prefix: &str) -> Result<String, Vec<String>> {
    let keys = if prefix.is_empty() {
        String::new()
    } else {
        format!("{prefix}/")
    };
    let mut notes = Vec::new();
    for rule in rules {
        let Some(expiration) = &rule.noncurrent_version_expiration else {
            continue;
        };
        let id = rule.id.as_deref().unwrap_or("(no ID)");
        let filter = rule.filter.as_ref();
        let and = filter.and_then(|f| f.and.as_deref());
        let narrowed = [filter, and]
            .into_iter()
            .flatten()
            .any(|f| !f.tag.is_empty() || f.size_above.is_some() || f.size_below.is_some());
        let rule_prefix = [
            rule.prefix.as_deref(),
            filter.and_then(|f| f.prefix.as_deref()),
            and.and_then(|f| f.prefix.as_deref()),
        ]
        .into_iter()
        .flatten()
        .next()
        .unwrap_or("");
        let kept = expiration.newer_noncurrent_versions.unwrap_or(0);
        if rule.status != "Enabled" {
            notes.push(format!("rule {id} is {}", rule.status));
        } else if narrowed {
            notes.push(format!(
                "rule {id} applies only to objects of some tags or sizes"
            ));
        } else if !keys.starts_with(rule_prefix) {
            notes.push(format!("rule {id} applies only under {rule_prefix}"));
        } else if kept > 0 {
            notes.push(format!(
                "rule {id} keeps the newest {kept} noncurrent versions of each key"
            ));
        } else {
            return Ok(match expiration.noncurrent_days {
                Some(days) => {
                    format!("lifecycle rule {id} expires noncurrent versions after {days} days")
                }
                None => format!("lifecycle rule {id} expires noncurrent versions"),
            });
        }
    }
    Err(notes)
}

/// `<VersioningConfiguration>`: `Status` is `Enabled`, `Suspended`, or absent (never on).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Versioning {
    status: Option<String>,
}

/// `<LifecycleConfiguration>`: its rules.
#[derive(Debug, Deserialize)]
struct Lifecycle {
    #[serde(rename = "Rule", default)]
    rules: Vec<Rule>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Rule {
    #[serde(rename = "ID")]
    id: Option<String>,
    status: String,
    /// The rule's prefix as older configurations spell it, outside a `Filter`.
    prefix: Option<String>,
    filter: Option<Filter>,
    noncurrent_version_expiration: Option<NoncurrentVersionExpiration>,
}

/// A rule's `Filter`, or the `And` inside one: what narrows the objects it applies to.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Filter {
    prefix: Option<String>,
    #[serde(default)]
    tag: Vec<IgnoredAny>,
    #[serde(rename = "ObjectSizeGreaterThan")]
    size_above: Option<IgnoredAny>,
    #[serde(rename = "ObjectSizeLessThan")]
    size_below: Option<IgnoredAny>,
    and: Option<Box<Filter>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct NoncurrentVersionExpiration {
    noncurrent_days: Option<u32>,
    newer_noncurrent_versions: Option<u32>,
}

/// S3's `<Error>`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ErrorBody {
    code: String,
    message: Option<String>,
}

/// What a subresource's answer says.
#[derive(Debug)]
enum Read<T> {
    Config(T),
    /// The bucket has none (`NoSuchLifecycleConfiguration`, …): S3's code and message.
    NoConfiguration(String),
    /// The store does not implement the call (501 `NotImplemented`): its message.
    NotImplemented(String),
    /// No answer, a refusal (`AccessDenied`), or an answer that cannot be read: why.
    Failed(String),
}

/// A configuration S3 answers with, in an element of this name.
trait Document: DeserializeOwned {
    const ELEMENT: &str;
}

impl Document for Versioning {
    const ELEMENT: &str = "VersioningConfiguration";
}

impl Document for Lifecycle {
    const ELEMENT: &str = "LifecycleConfiguration";
}

/// The answer read as the configuration `T`, or as S3's error.
fn read<T: Document>(answer: Result<BucketAnswer, String>) -> Read<T> {
    let element = T::ELEMENT;
    let answer = match answer {
        Ok(answer) => answer,
        Err(why) => return Read::Failed(why),
    };
    if answer.status == 200 {
        return match quick_xml::de::from_str(&answer.body) {
            Ok(config) if root_element(&answer.body).as_deref() == Some(element) => {
                Read::Config(config)
            }
            Ok(_) => Read::Failed(format!("an answer that is no <{element}>")),
            Err(err) => Read::Failed(format!("an answer that is not S3's XML: {err}")),
        };
    }
    let error = quick_xml::de::from_str::<ErrorBody>(&answer.body)
        .ok()
        .filter(|_| root_element(&answer.body).as_deref() == Some("Error"));
    let Some(error) = error else {
        return Read::Failed(format!("HTTP {}", answer.status));
    };
    let said = match &error.message {
        Some(message) => format!("{}: {message}", error.code),
        None => error.code.clone(),
    };
    if answer.status == 501 || error.code == "NotImplemented" {
        Read::NotImplemented(said)
    } else if answer.status == 404
        && error.code.starts_with("NoSuch")
        && error.code != "NoSuchBucket"
    {
        Read::NoConfiguration(said)
    } else {
        Read::Failed(format!("HTTP {} {said}", answer.status))
    }
}

/// The name of the document's first element (the deserializer reads any).
fn root_element(xml: &str) -> Option<String> {
    let mut reader = quick_xml::Reader::from_str(xml);
    loop {
        match reader.read_event() {
            Ok(Event::Start(element) | Event::Empty(element)) => {
                return Some(String::from_utf8_lossy(element.local_name().as_ref()).into_owned());
            }
            Ok(Event::Eof) | Err(_) => return None,
            Ok(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: u16, body: &str) -> Result<BucketAnswer, String> {
        Ok(BucketAnswer {
            status,
            body: body.to_owned(),
        })
    }

    fn status(body: &str) -> Option<String> {
        match read::<Versioning>(answer(200, body)) {
            Read::Config(versioning) => versioning.status,
            other => panic!("{other:?}"),
        }
    }

    fn rules(body: &str) -> Vec<Rule> {
        match read::<Lifecycle>(answer(200, body)) {
            Read::Config(lifecycle) => lifecycle.rules,
            other => panic!("{other:?}"),
        }
    }

    /// GetBucketVersioning's answers, as AWS documents them.
    #[test]
    fn op7_versioning_is_read_as_s3_answers_it() {
        let enabled = r#"<?xml version="1.0" encoding="UTF-8"?>
            <VersioningConfiguration xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
              <Status>Enabled</Status>
              <MfaDelete>Disabled</MfaDelete>
            </VersioningConfiguration>"#;
        assert_eq!(status(enabled).as_deref(), Some("Enabled"));
        let suspended = r#"<VersioningConfiguration xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
              <Status>Suspended</Status></VersioningConfiguration>"#;
        assert_eq!(status(suspended).as_deref(), Some("Suspended"));
        let never = r#"<VersioningConfiguration xmlns="http://s3.amazonaws.com/doc/2006-03-01/"/>"#;
        assert_eq!(status(never), None);

        let denied = "<Error><Code>AccessDenied</Code><Message>Access Denied</Message>\
                      <RequestId>R</RequestId></Error>";
        assert!(
            matches!(read::<Versioning>(answer(403, denied)), Read::Failed(why) if why == "HTTP 403 AccessDenied: Access Denied")
        );
        let s3s = "<Error><Code>NotImplemented</Code>\
                   <Message>GetBucketVersioning is not implemented yet</Message></Error>";
        assert!(matches!(
            read::<Versioning>(answer(501, s3s)),
            Read::NotImplemented(why) if why.contains("GetBucketVersioning")
        ));
        assert!(matches!(
            read::<Versioning>(answer(200, "<html>a proxy's page</html><")),
            Read::Failed(_)
        ));
        assert!(matches!(
            read::<Versioning>(Err("connection refused".to_owned())),
            Read::Failed(why) if why == "connection refused"
        ));
    }

    /// GetBucketLifecycleConfiguration's answers, as AWS documents them: a rule expiring
    /// noncurrent versions, others that do not (another action, disabled, another prefix,
    /// tags, the newest versions kept), and none at all.
    #[test]
    fn op7_a_lifecycle_rule_must_expire_every_noncurrent_version_under_the_root() {
        let expiring_rule = r#"<LifecycleConfiguration xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
              <Rule>
                <ID>transition-only</ID>
                <Filter><Prefix></Prefix></Filter>
                <Status>Enabled</Status>
                <Transition><Days>30</Days><StorageClass>GLACIER</StorageClass></Transition>
              </Rule>
              <Rule>
                <ID>old-versions</ID>
                <Filter><Prefix>outputs/</Prefix></Filter>
                <Status>Enabled</Status>
                <NoncurrentVersionExpiration>
                  <NoncurrentDays>7</NoncurrentDays>
                </NoncurrentVersionExpiration>
              </Rule>
            </LifecycleConfiguration>"#;
        let found = rules(expiring_rule);
        assert_eq!(found.len(), 2);
        assert_eq!(
            expiring(&found, "outputs"),
            Ok("lifecycle rule old-versions expires noncurrent versions after 7 days".to_owned())
        );
        // The control: the same rules leave another root's old versions.
        assert_eq!(
            expiring(&found, "traces"),
            Err(vec![
                "rule old-versions applies only under outputs/".to_owned()
            ])
        );
        assert!(expiring(&found, "").is_err());

        let others = r#"<LifecycleConfiguration>
              <Rule>
                <ID>off</ID><Filter/><Status>Disabled</Status>
                <NoncurrentVersionExpiration><NoncurrentDays>1</NoncurrentDays></NoncurrentVersionExpiration>
              </Rule>
              <Rule>
                <ID>tagged</ID>
                <Filter><And><Prefix>outputs/</Prefix>
                  <Tag><Key>a</Key><Value>1</Value></Tag><Tag><Key>b</Key><Value>2</Value></Tag>
                </And></Filter>
                <Status>Enabled</Status>
                <NoncurrentVersionExpiration><NoncurrentDays>1</NoncurrentDays></NoncurrentVersionExpiration>
              </Rule>
              <Rule>
                <ID>keeps-two</ID><Prefix>out</Prefix><Status>Enabled</Status>
                <NoncurrentVersionExpiration>
                  <NoncurrentDays>1</NoncurrentDays><NewerNoncurrentVersions>2</NewerNoncurrentVersions>
                </NoncurrentVersionExpiration>
              </Rule>
              <Rule>
                <ID>current-only</ID><Filter><Prefix>outputs/</Prefix></Filter><Status>Enabled</Status>
                <Expiration><Days>30</Days></Expiration>
              </Rule>
            </LifecycleConfiguration>"#;
        assert_eq!(
            expiring(&rules(others), "outputs"),
            Err(vec![
                "rule off is Disabled".to_owned(),
                "rule tagged applies only to objects of some tags or sizes".to_owned(),
                "rule keeps-two keeps the newest 2 noncurrent versions of each key".to_owned(),
            ])
        );

        let none = "<Error><Code>NoSuchLifecycleConfiguration</Code>\
                    <Message>The lifecycle configuration does not exist</Message>\
                    <BucketName>b</BucketName></Error>";
        assert!(matches!(
            read::<Lifecycle>(answer(404, none)),
            Read::NoConfiguration(_)
        ));
        let no_bucket = "<Error><Code>NoSuchBucket</Code><Message>gone</Message></Error>";
        assert!(matches!(
            read::<Lifecycle>(answer(404, no_bucket)),
            Read::Failed(_)
        ));
        assert_eq!(expiring(&[], "outputs"), Err(Vec::new()));
    }
}
