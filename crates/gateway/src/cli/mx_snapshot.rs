//! `mx-snapshot -c CONF --out FILE`: day-one knowledge for the MX neighbourhood index. Resolves
//! the MX hosts (and their addresses) of every listed throwaway name the configured data holds,
//! with bounded concurrency and rate, and writes what it learned in the index's file format;
//! the gateway loads it at start (`gateway.mx.neighbourhood.snapshot`).
//!
//! Resumable: the file is appended to, one line per name as soon as it is resolved, and names
//! already in it are skipped when the command runs again. A name DNS did not answer for is
//! not written, so the next run retries it.

use std::collections::HashSet;
use std::io::{IsTerminal, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{settings, CommandError};
use drg_domain::neighbour_index::{keys_of, Learned, Teach, Teachers};
use drg_evidence::mx::neighbourhood::{store, today};
use drg_evidence::mx::resolver::MxResolver;

/// How `mx-snapshot` goes about it.
#[derive(Debug, Clone, Copy)]
pub struct SnapshotOptions {
    /// Names resolved at once.
    pub concurrency: usize,
    /// Names started per second at most.
    pub rate: u32,
    /// Stop after this many new names (`None`: all).
    pub limit: Option<usize>,
}

/// What a run did.
#[derive(Debug, Default)]
struct Tally {
    resolved: usize,
    with_keys: usize,
    unanswered: usize,
}

/// `mx-snapshot`: see the module documentation. Returns the summary line.
pub fn mx_snapshot(conf: &Path, out: &Path, opts: SnapshotOptions) -> Result<String, CommandError> {
    let settings = settings(conf, Default::default())?;
    let table = settings.gateway.data_sources().build()?;
    let done = already_done(out)?;
    let mut names = table.listed_registrable();
    names.retain(|n| !done.contains(n));
    if let Some(limit) = opts.limit {
        names.truncate(limit);
    }
    let file = open_out(out, done.is_empty())?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    // Hosts of shared services (the table's mail providers) give no key: their addresses are
    // not asked.
    let table = Arc::new(arc_swap::ArcSwap::from_pointee(table));
    let resolver = Arc::new(MxResolver::new(&settings.gateway.mx)?.with_providers(table.clone()));
    // A lying resolver would write every listed name without keys, and a rerun skips names
    // already written: the canaries must vouch for it first, as in `serve`.
    let trust = runtime.block_on(resolver.check_canaries());
    if trust != drg_evidence::mx::trust::Trust::Trusted {
        return Err(format!(
            "mx-snapshot: the DNS resolver is {} (gateway.mx.canaries came back without MX \
             records); nothing written. Point gateway.mx.servers at a resolver that answers",
            trust.as_str()
        )
        .into());
    }
    let started = Instant::now();
    let total = names.len();
    let tally = runtime.block_on(run(resolver, &table.load(), names, file, opts))?;
    let secs = started.elapsed().as_secs_f64().max(0.001);
    Ok(format!(
        "mx-snapshot: {} names resolved in {:.1} s ({:.0}/s), {} with MX keys, {} not answered \
         (not written: run again to retry); {} already in {} before this run; {} to go",
        tally.resolved,
        secs,
        tally.resolved as f64 / secs,
        tally.with_keys,
        tally.unanswered,
        done.len(),
        out.display(),
        total - tally.resolved - tally.unanswered,
    ))
}

/// The names a previous run wrote (an absent file: none).
fn already_done(out: &Path) -> Result<HashSet<String>, CommandError> {
    Ok(match store::read(out)? {
        Some((learned, _)) => learned.into_iter().map(|l| l.domain.into()).collect(),
        None => HashSet::new(),
    })
}

/// Opens the snapshot for appending, created 0600 if missing: it lands in the state folder, whose
/// files are the service user's alone.
fn open_out(out: &Path, fresh: bool) -> Result<std::fs::File, CommandError> {
    drg_base::infra::fsutil::create_private(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(out)
        .map_err(|e| format!("{}: {e}", out.display()))?;
    if fresh && file.metadata()?.len() == 0 {
        writeln!(file, "{}", store::header())?;
    }
    Ok(file)
}

async fn run(
    resolver: Arc<MxResolver>,
    table: &drg_domain::DomainTable,
    names: Vec<String>,
    file: std::fs::File,
    opts: SnapshotOptions,
) -> Result<Tally, CommandError> {
    let bar = progress(names.len());
    let slots = Arc::new(tokio::sync::Semaphore::new(opts.concurrency.max(1)));
    let mut pace =
        tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(opts.rate.max(1))));
    pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    // Started on its own task, so results are written (and the bar moves) as they come.
    tokio::spawn(async move {
        for name in names {
            pace.tick().await;
            let Ok(slot) = slots.clone().acquire_owned().await else {
                break;
            };
            let (resolver, tx) = (resolver.clone(), tx.clone());
            tokio::spawn(async move {
                let found = resolver.observe(&name).await;
                let _ = tx.send((name, found));
                drop(slot);
            });
        }
    });
    let file = Mutex::new(std::io::BufWriter::new(file));
    let mut tally = Tally::default();
    let day = today();
    while let Some((name, found)) = rx.recv().await {
        bar.inc(1);
        let Some(drg_evidence::mx::resolver::Observed { hosts, .. }) = found else {
            tally.unanswered += 1;
            continue;
        };
        let keys = keys_of(&name, &hosts, table.providers());
        tally.resolved += 1;
        tally.with_keys += usize::from(!keys.is_empty());
        // The lists' own: it judges every project's answers (`Teachers::GLOBAL`).
        let how = Teach {
            teachers: Teachers::GLOBAL,
            ..Teach::default()
        };
        let line = store::line(&Learned::new(&name, keys, day, how));
        let mut f = file.lock().unwrap_or_else(|p| p.into_inner());
        writeln!(f, "{line}")?;
        // Each line on disk as it is learned: an interrupted run resumes where it stopped.
        f.flush()?;
    }
    bar.finish_and_clear();
    Ok(tally)
}

/// A progress bar on a terminal; nothing otherwise (a cron job's log stays clean).
fn progress(len: usize) -> indicatif::ProgressBar {
    if !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(len as u64);
    if let Ok(style) =
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} names, {per_sec}, {eta} left")
    {
        bar.set_style(style);
    }
    bar
}
