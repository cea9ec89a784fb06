//! The bucket a root is in: its `s3://BUCKET/PREFIX` URL read, and the bucket's own
//! configuration read (`?versioning`, `?lifecycle`: `sexton doctor`, OP-7). `object_store` 0.14
//! has no call for a bucket's configuration, but its [`Signer`] presigns any request with the
//! client's own credentials and region: a GET of the bucket with the subresource in the query,
//! fetched with the HTTP client `object_store` itself uses.

use std::time::Duration;

use object_store::path::Path as Key;
use object_store::signer::{SignedUrlOptions, Signer as _};

use super::{ObjectRoot, key_of};

/// How long a presigned request is valid, and how long its answer is waited for.
const WAIT: Duration = Duration::from_secs(30);

/// A root's text that is `s3://BUCKET/PREFIX`, split (the prefix without its slashes); `None`
/// for any other text (a local path).
///
/// # Errors
/// The text starts with `s3://` but names no bucket, or a prefix that is not one key's start.
pub fn parse_url(text: &str) -> Option<Result<(String, String), String>> {
    let rest = text.strip_prefix("s3://")?;
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        return Some(Err("s3://BUCKET/PREFIX, with a bucket".to_owned()));
    }
    let prefix = prefix.trim_end_matches('/');
    if !prefix.is_empty()
        && let Err(why) = key_of("", prefix)
    {
        return Some(Err(format!("s3://BUCKET/PREFIX, the prefix {why}")));
    }
    Some(Ok((bucket.to_owned(), prefix.to_owned())))
}

/// What the store answered for a bucket's subresource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketAnswer {
    /// The HTTP status.
    pub status: u16,
    /// The body: S3's XML, the configuration or an `<Error>`.
    pub body: String,
}

impl ObjectRoot {
    /// The bucket's name.
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// The prefix the root's keys start with (without its slashes; empty for a whole bucket).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The GET of the bucket with `?subresource=` (`versioning`, `lifecycle`), presigned.
    ///
    /// # Errors
    /// The root has no S3 client of its own (one built around another store), or the request
    /// cannot be signed (no credentials).
    pub async fn bucket_url(&self, subresource: &str) -> Result<reqwest::Url, String> {
        let signer = self
            .signer
            .as_ref()
            .ok_or_else(|| format!("{self}: no S3 client of its own to sign with"))?;
        let query = SignedUrlOptions::new().with_query([(subresource, "")]);
        signer
            .signed_url_opts(reqwest::Method::GET, &Key::default(), WAIT, &query)
            .await
            .map_err(|err| err.to_string())
    }

    /// The bucket's `subresource` as the store answers it, error or not.
    ///
    /// # Errors
    /// See [`bucket_url`](Self::bucket_url); or the request got no answer (the reason).
    pub async fn bucket_config(&self, subresource: &str) -> Result<BucketAnswer, String> {
        let url = self.bucket_url(subresource).await?;
        let client = reqwest::Client::builder()
            .timeout(WAIT)
            .build()
            .map_err(|err| err.to_string())?;
        let response = client
            .get(url)
            .send()
            .await
            .map_err(|err| err.to_string())?;
        let status = response.status().as_u16();
        let body = response.bytes().await.map_err(|err| err.to_string())?;
        Ok(BucketAnswer {
            status,
            body: String::from_utf8_lossy(&body).into_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::object::StorageSettings;

    #[test]
    fn os1_urls_name_a_bucket_and_a_prefix() {
        assert_eq!(
            parse_url("s3://b/p/q/").unwrap().unwrap(),
            ("b".to_owned(), "p/q".to_owned())
        );
        assert_eq!(
            parse_url("s3://b").unwrap().unwrap(),
            ("b".to_owned(), String::new())
        );
        assert!(parse_url("s3:///p").unwrap().is_err());
        assert!(parse_url("s3://b/p//q").unwrap().is_err());
        assert!(parse_url("/var/lib/platform").is_none());
    }

    /// The subresource is the query's first pair, `versioning=` (S3 reads an empty value as
    /// the subresource, and signs it so), on the bucket's root, before the signature's pairs.
    #[tokio::test]
    async fn op7_a_bucket_subresource_is_presigned_on_the_buckets_root() {
        let storage = StorageSettings {
            endpoint: Some("http://127.0.0.1:9".to_owned()),
            region: Some("eu-west-1".to_owned()),
            path_style: true,
            allow_http: true,
            access_key_id: Some("AKIDEXAMPLE".to_owned()),
            secret_access_key: Some("secret".to_owned()),
            batch_delete: true,
            max_in_flight: 4,
        };
        let root = ObjectRoot::new("bucket", "outputs", &storage).unwrap();
        let url = root.bucket_url("versioning").await.unwrap();
        assert_eq!(url.path(), "/bucket/");
        let query = url.query().unwrap();
        assert!(
            query.starts_with("versioning=&X-Amz-Algorithm=AWS4-HMAC-SHA256&"),
            "{query}"
        );
        assert!(
            query.contains("%2Feu-west-1%2Fs3%2Faws4_request"),
            "{query}"
        );
        assert!(query.contains("&X-Amz-Signature="), "{query}");

        let virtual_hosted = StorageSettings {
            endpoint: None,
            path_style: false,
            ..storage
        };
        let root = ObjectRoot::new("bucket", "", &virtual_hosted).unwrap();
        let url = root.bucket_url("lifecycle").await.unwrap();
        assert_eq!(url.host_str(), Some("bucket.s3.eu-west-1.amazonaws.com"));
        assert_eq!(url.path(), "/");
        assert!(url.query().unwrap().starts_with("lifecycle=&"), "{url}");
        // A root around another store has no client to sign with.
        let wrapped = ObjectRoot::with_store(
            "bucket",
            "",
            std::sync::Arc::new(object_store::memory::InMemory::new()),
        );
        assert!(wrapped.bucket_url("versioning").await.is_err());
    }
}
