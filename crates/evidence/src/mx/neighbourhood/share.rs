//! What gateways on one Redis learn, shared: a stream `drg:mx:neighbourhood` of batches (one
//! entry per batch: the sending gateway's id and its learned domains as JSON lines), trimmed to
//! about `max_entries` batches. Each gateway appends what it learned and reads what the others
//! appended since its last read; on start it reads the whole stream, so a new gateway starts
//! with what the others know. Listed or not is decided by each reader's own table.
//!
//! One key: cluster-safe. Writes are bounded: one `XADD` per share interval and per
//! [`BATCH`] domains.

use drg_base::infra::redis::config::RedisConfig;
use drg_base::infra::redis::{stream_id_after, RedisLink};
use drg_domain::neighbour_index::Learned;

/// The stream's key.
pub const KEY: &str = "drg:mx:neighbourhood";
/// Learned domains per stream entry at most.
pub const BATCH: usize = 500;
/// Entries read per call.
const PAGE: usize = 100;

/// The Redis side of the index (see the module documentation).
pub struct SharedIndex {
    link: tokio::sync::OnceCell<RedisLink>,
    config: RedisConfig,
    /// This gateway's id: its own batches are not taught twice.
    id: String,
    /// The last entry read (`0`: none yet).
    last: tokio::sync::Mutex<String>,
    max_len: usize,
}

type Entry = (String, Vec<String>);

impl SharedIndex {
    pub fn new(config: &RedisConfig, max_entries: usize) -> Self {
        let id = getrandom::u64().unwrap_or_else(|_| u64::from(std::process::id()));
        SharedIndex {
            link: tokio::sync::OnceCell::new(),
            config: config.clone(),
            id: format!("{id:016x}"),
            last: tokio::sync::Mutex::new("0".into()),
            // Batches, not domains: a full batch holds BATCH domains.
            max_len: (max_entries / 10).max(1_000),
        }
    }

    async fn link(&self) -> redis::RedisResult<RedisLink> {
        self.link
            .get_or_try_init(|| async { RedisLink::connect_lazy(&self.config) })
            .await
            .cloned()
    }

    /// Appends `learned` in batches.
    pub async fn push(&self, learned: &[Learned]) -> redis::RedisResult<()> {
        if learned.is_empty() {
            return Ok(());
        }
        let mut link = self.link().await?;
        for batch in learned.chunks(BATCH) {
            let lines: Vec<String> = batch.iter().map(super::store::line).collect();
            redis::cmd("XADD")
                .arg(KEY)
                .arg("MAXLEN")
                .arg("~")
                .arg(self.max_len)
                .arg("*")
                .arg("g")
                .arg(&self.id)
                .arg("o")
                .arg(lines.join("\n"))
                .query_async::<String>(&mut link)
                .await?;
        }
        Ok(())
    }

    /// What the other gateways appended since the last call (at most `pages` pages).
    pub async fn pull(&self, pages: usize) -> redis::RedisResult<Vec<Learned>> {
        let mut link = self.link().await?;
        let mut last = self.last.lock().await;
        let mut out = Vec::new();
        for _ in 0..pages {
            let from = match last.as_str() {
                "0" => "-".to_owned(),
                id => stream_id_after(id).unwrap_or_else(|| "+".into()),
            };
            let entries: Vec<Entry> = redis::cmd("XRANGE")
                .arg(KEY)
                .arg(&from)
                .arg("+")
                .arg("COUNT")
                .arg(PAGE)
                .query_async(&mut link)
                .await?;
            let n = entries.len();
            for (id, fields) in entries {
                let field = |name: &str| {
                    fields
                        .chunks_exact(2)
                        .find(|kv| kv[0] == name)
                        .map(|kv| kv[1].as_str())
                };
                if field("g") != Some(self.id.as_str()) {
                    out.extend(
                        field("o")
                            .unwrap_or_default()
                            .lines()
                            .filter_map(|l| serde_json::from_str::<Learned>(l).ok())
                            .filter(super::store::valid),
                    );
                }
                *last = id;
            }
            if n < PAGE {
                break;
            }
        }
        Ok(out)
    }
}
