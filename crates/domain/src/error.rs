//! `SourceError`: why a data source (a domain list, `domains.csv`, `mx_providers.csv`) was refused.
//!
//! Its own module so that every parser (`sources`, `providers`) reports the same type without
//! importing another parser.

/// A source that could not be read, with where and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{origin}:{line}: {message}")]
pub struct SourceError {
    /// The file (or built-in source) the error is in.
    pub origin: String,
    /// 1-based line number; 0 when the source as a whole is at fault.
    pub line: usize,
    pub message: String,
}

impl SourceError {
    pub fn new(origin: &str, line: usize, message: impl Into<String>) -> Self {
        SourceError {
            origin: origin.to_owned(),
            line,
            message: message.into(),
        }
    }
}
