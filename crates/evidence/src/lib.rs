//! The evidence a verdict rests on besides the name itself (the `drg-evidence` crate): the
//! domain table's inputs and their reloads (`data`), MX evidence from live DNS (`mx`), domain age
//! from the registries (`rdap`). Everything from outside is checked before it is believed.
//!
//! It must never import another gateway part or Pingora: the gateway composes `data`, `mx` and
//! `rdap`, naming them by this crate.

// Its docs link private items freely: they are for the next engineer, not a public API.
#![allow(rustdoc::private_intra_doc_links)]

pub mod data;
pub mod listed_holds;
pub mod mx;
pub mod rdap;
