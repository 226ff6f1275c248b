//! OCI image references: the shape the CRD schema enforces, and a parser for the pieces.
//!
//! The grammar follows the distribution reference format: an optional registry host (with an
//! optional port), slash-separated lowercase path components, an optional `:tag` and an
//! optional `@sha256:<64 hex>` digest.

use std::fmt;

/// RE2/Rust-regex pattern for a full image reference, used verbatim in the CRD schema.
pub const IMAGE_REFERENCE_PATTERN: &str = concat!(
    r"^(?:(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)(?:\.(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?))*(?::[0-9]+)?/)?",
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*",
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?",
    r"(?:@sha256:[a-f0-9]{64})?$",
);

/// A parsed image reference.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageRef {
    /// Registry host and repository path, e.g. `ghcr.io/schedkit/scx_rusty`.
    pub repository: String,
    pub tag: Option<String>,
    /// `sha256:<hex>`.
    pub digest: Option<String>,
}

/// Why a string is not an image reference.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ImageRefError {
    #[error("image reference is empty")]
    Empty,
    #[error("image reference {0:?} has an invalid digest: expected @sha256:<64 lowercase hex digits>")]
    Digest(String),
    #[error("image reference {0:?} has an empty repository")]
    Repository(String),
}

impl ImageRef {
    /// Splits a reference into repository, tag and digest. The schema has already checked the
    /// character set; this only needs to find the boundaries.
    pub fn parse(reference: &str) -> Result<Self, ImageRefError> {
        if reference.is_empty() {
            return Err(ImageRefError::Empty);
        }
        let (name, digest) = match reference.split_once('@') {
            Some((name, digest)) => {
                let hex = digest.strip_prefix("sha256:").ok_or_else(|| ImageRefError::Digest(reference.to_owned()))?;
                if hex.len() != 64 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
                    return Err(ImageRefError::Digest(reference.to_owned()));
                }
                (name, Some(digest.to_owned()))
            }
            None => (reference, None),
        };
        // A tag follows the last ':' after the last '/', so a registry port is not a tag.
        let last_slash = name.rfind('/').map_or(0, |i| i + 1);
        let (repository, tag) = match name[last_slash..].rfind(':') {
            Some(i) => (&name[..last_slash + i], Some(name[last_slash + i + 1..].to_owned())),
            None => (name, None),
        };
        if repository.is_empty() {
            return Err(ImageRefError::Repository(reference.to_owned()));
        }
        Ok(Self { repository: repository.to_owned(), tag, digest })
    }

    /// True when the reference pins content by digest.
    pub fn is_pinned(&self) -> bool {
        self.digest.is_some()
    }
}

impl fmt::Display for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.repository)?;
        if let Some(tag) = &self.tag {
            write!(f, ":{tag}")?;
        }
        if let Some(digest) = &self.digest {
            write!(f, "@{digest}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn pattern() -> regex::Regex {
        regex::Regex::new(IMAGE_REFERENCE_PATTERN).expect("the schema pattern compiles")
    }

    #[test]
    fn schema_pattern_accepts_real_references() {
        let re = pattern();
        for ok in [
            "busybox",
            "library/busybox:1.36",
            "ghcr.io/schedkit/scx_rusty:latest",
            "localhost:5000/sked/canary:v1",
            "127.0.0.1:5000/a/b/c",
            &format!("ghcr.io/schedkit/scx_rusty@{DIGEST}"),
            &format!("ghcr.io/schedkit/scx_rusty:v1.2.3@{DIGEST}"),
            "registry.example.com/team/scx__lavd-x:1.0.0-rc.1",
        ] {
            assert!(re.is_match(ok), "{ok} should be accepted");
        }
    }

    #[test]
    fn schema_pattern_refuses_malformed_references() {
        let re = pattern();
        for bad in [
            "",
            "Ghcr.io/UPPER/Case",
            "ghcr.io/schedkit/scx_rusty:",
            "ghcr.io/schedkit/scx_rusty@sha256:short",
            "ghcr.io/schedkit/scx_rusty@md5:0123",
            "ghcr.io//double",
            "has space:latest",
            "ghcr.io/schedkit/scx_rusty:-leadingdash",
            "-registry/x",
        ] {
            assert!(!re.is_match(bad), "{bad:?} should be refused");
        }
    }

    #[test]
    fn parse_separates_port_tag_and_digest() {
        let r = ImageRef::parse("localhost:5000/sked/canary:v1").unwrap();
        assert_eq!(r.repository, "localhost:5000/sked/canary");
        assert_eq!(r.tag.as_deref(), Some("v1"));
        assert_eq!(r.digest, None);

        let r = ImageRef::parse("localhost:5000/sked/canary").unwrap();
        assert_eq!(r.repository, "localhost:5000/sked/canary");
        assert_eq!(r.tag, None);

        let pinned = format!("ghcr.io/a/b:v2@{DIGEST}");
        let r = ImageRef::parse(&pinned).unwrap();
        assert_eq!(r.repository, "ghcr.io/a/b");
        assert_eq!(r.tag.as_deref(), Some("v2"));
        assert_eq!(r.digest.as_deref(), Some(DIGEST));
        assert!(r.is_pinned());
        assert_eq!(r.to_string(), pinned);
    }

    #[test]
    fn parse_refuses_bad_digests() {
        assert_eq!(ImageRef::parse(""), Err(ImageRefError::Empty));
        assert!(matches!(ImageRef::parse("a/b@sha256:abc"), Err(ImageRefError::Digest(_))));
        assert!(matches!(ImageRef::parse("a/b@sha512:abc"), Err(ImageRefError::Digest(_))));
        assert!(matches!(ImageRef::parse(":tag"), Err(ImageRefError::Repository(_))));
    }
}
