//! Versioned job payloads (FL-1): every payload carries `"version": 1`; anything else is refused
//! when decoded, so that a job written by another version fails visibly instead of being guessed.

use std::fmt;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The payload version this build writes and reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct V1;

impl Serialize for V1 {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u32(1)
    }
}

impl<'de> Deserialize<'de> for V1 {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match u32::deserialize(deserializer)? {
            1 => Ok(V1),
            other => Err(serde::de::Error::custom(format!(
                "unsupported payload version {other}, expected 1"
            ))),
        }
    }
}

/// What a hop's payload may carry: serialized into the queue and back.
pub trait Payload:
    Serialize + DeserializeOwned + Clone + fmt::Debug + PartialEq + Send + Sync + 'static
{
}

impl<T> Payload for T where
    T: Serialize + DeserializeOwned + Clone + fmt::Debug + PartialEq + Send + Sync + 'static
{
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Serialize, Deserialize)]
    struct Job {
        version: V1,
    }

    #[test]
    fn fl1_only_version_one_decodes() {
        assert_eq!(
            serde_json::to_string(&Job { version: V1 }).unwrap(),
            r#"{"version":1}"#
        );
        let err = serde_json::from_str::<Job>(r#"{"version":2}"#).unwrap_err();
        assert!(
            err.to_string().contains("unsupported payload version 2"),
            "{err}"
        );
    }
}
