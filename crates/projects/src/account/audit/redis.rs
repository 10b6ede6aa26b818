//! The trail on the quota's Redis: one stream per project (`drg:audit:{<project>}`, its own
//! hash tag), each entry one field of JSON, trimmed at every append to [`super::MAX_ENTRIES`]
//! (`MAXLEN ~`: Redis keeps a few more until a whole node can go) and to the plan's retention
//! (`MINID ~`). A stream's ids increase: they are the entries' ids and the paging cursor.

use std::time::Duration;

use super::{AuditError, AuditStore, Entry};
use drg_base::infra::redis::config::RedisConfig;
use drg_base::infra::redis::LazyLink;

/// The least budget of one call.
const MIN_CALL_BUDGET: Duration = Duration::from_secs(1);

/// The Redis store.
pub struct RedisAudit {
    link: LazyLink,
}

fn stream(project: &str) -> String {
    format!("drg:audit:{{{project}}}")
}

impl RedisAudit {
    pub fn new(config: &RedisConfig) -> RedisAudit {
        RedisAudit {
            link: LazyLink::new(config, MIN_CALL_BUDGET),
        }
    }
}

#[async_trait::async_trait]
impl AuditStore for RedisAudit {
    async fn append(&self, entry: Entry, keep_days: u32) -> Result<(), AuditError> {
        let mut link = self
            .link
            .get()
            .await
            .map_err(drg_base::infra::redis::LinkError::from)?;
        let cutoff_ms = chrono::Utc::now().timestamp_millis() - i64::from(keep_days) * 86_400_000;
        // The count with the append, then the age: one trim strategy a command.
        let key = stream(&entry.project);
        let mut pipe = ::redis::pipe();
        pipe.cmd("XADD")
            .arg(&key)
            .arg("MAXLEN")
            .arg("~")
            .arg(super::MAX_ENTRIES)
            .arg("*")
            .arg("e")
            .arg(serde_json::to_string(&entry)?)
            .ignore()
            .cmd("XTRIM")
            .arg(&key)
            .arg("MINID")
            .arg("~")
            .arg(cutoff_ms.max(0))
            .ignore();
        let () = self.link.timed(pipe.query_async(&mut link)).await?;
        Ok(())
    }

    async fn page(
        &self,
        project: &str,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Entry>, AuditError> {
        let mut link = self
            .link
            .get()
            .await
            .map_err(drg_base::infra::redis::LinkError::from)?;
        // Exclusive of the cursor (`(id`); a cursor that is not a stream id starts at the top.
        let end = match cursor {
            Some(c) if drg_base::infra::redis::stream_id_after(c).is_some() => format!("({c}"),
            _ => "+".to_owned(),
        };
        let mut cmd = ::redis::cmd("XREVRANGE");
        cmd.arg(stream(project))
            .arg(end)
            .arg("-")
            .arg("COUNT")
            .arg(limit);
        type Reply = Vec<(String, Vec<(String, String)>)>;
        let rows: Reply = self.link.timed(cmd.query_async(&mut link)).await?;
        Ok(rows
            .into_iter()
            .filter_map(|(id, fields)| {
                let json = fields.into_iter().find(|(k, _)| k == "e")?.1;
                let mut e: Entry = serde_json::from_str(&json).ok()?;
                e.id = id;
                Some(e)
            })
            .collect())
    }
}
