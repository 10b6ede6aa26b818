//! The domain table's inputs: data files on disk, lists fetched from URLs, and the hot reload of any file-backed snapshot.

pub mod config;
pub mod files;
pub mod sources;
