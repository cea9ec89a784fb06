//! `[storage]`: how sexton reaches the object store (OS-1).

use std::fmt;

use super::DEFAULT_MAX_IN_FLIGHT;

/// How sexton reaches the object store: what `[storage]` says, the standard AWS environment
/// variables filling in what it leaves out (OS-1).
#[derive(Clone, PartialEq, Eq)]
pub struct StorageSettings {
    /// The store's URL (`http://127.0.0.1:8014`); AWS's own endpoint when unset.
    pub endpoint: Option<String>,
    pub region: Option<String>,
    /// Path-style requests (`endpoint/bucket/key`) instead of virtual-hosted ones.
    pub path_style: bool,
    /// Plain HTTP to the endpoint (a store on loopback).
    pub allow_http: bool,
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
    /// DeleteObjects batches; off for a store that has none (single deletes, OS-4).
    pub batch_delete: bool,
    /// Requests each root has in flight at the most (its [`Window`](super::Window)'s ceiling;
    /// at least 1).
    pub max_in_flight: usize,
}

impl Default for StorageSettings {
    fn default() -> Self {
        Self {
            endpoint: None,
            region: None,
            path_style: false,
            allow_http: false,
            access_key_id: None,
            secret_access_key: None,
            batch_delete: false,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
        }
    }
}

impl fmt::Debug for StorageSettings {
    /// Never the secret (OS-1).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StorageSettings")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("path_style", &self.path_style)
            .field("allow_http", &self.allow_http)
            .field("access_key_id", &self.access_key_id)
            .field(
                "secret_access_key",
                &self.secret_access_key.as_ref().map(|_| "(set)"),
            )
            .field("batch_delete", &self.batch_delete)
            .field("max_in_flight", &self.max_in_flight)
            .finish()
    }
}
