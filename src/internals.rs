//! The gateway's inner modules, for its own binary, tests, benchmarks and fuzz targets. **Not
//! part of the API**: anything here may change in any release; embedders use the crate root.
//!
//! The parts (ARCHITECTURE.md has the map and the rules on who imports whom): `edge` (the
//! listener's side and the Pingora glue), `account`, `access`, `upstream`, `domain` (pure), `mx`,
//! `rdap`, `live_top`, `data`, `changes`, `ops`, `infra`; `state` and `answer` are shared by all; `config` composes
//! the parts' configuration; `server` wires everything; `cli` holds the subcommands. Declared
//! here with their files in `src/` so that the crate's root holds the API alone.

#[path = "access/mod.rs"]
pub mod access;
#[path = "account/mod.rs"]
pub mod account;
#[path = "answer.rs"]
pub mod answer;
#[path = "changes/mod.rs"]
pub mod changes;
#[path = "cli/mod.rs"]
pub mod cli;
#[path = "config.rs"]
pub mod config;
#[path = "data/mod.rs"]
pub mod data;
/// The pure domain logic, its own crate (`crates/domain`).
pub use drg_domain as domain;
#[path = "edge/mod.rs"]
pub mod edge;
#[path = "infra/mod.rs"]
pub mod infra;
#[path = "live_top/mod.rs"]
pub mod live_top;
#[path = "mx/mod.rs"]
pub mod mx;
#[path = "ops/mod.rs"]
pub mod ops;
#[path = "rdap/mod.rs"]
pub mod rdap;
#[path = "server.rs"]
pub mod server;
#[path = "state.rs"]
pub mod state;
#[path = "upstream/mod.rs"]
pub mod upstream;
