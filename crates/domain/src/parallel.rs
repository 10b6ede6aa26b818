//! `for_each_split`: the same work over the parts of a slice on a few scoped threads, results in
//! the parts' order.
//!
//! The table build of millions of names is the one place that wants more than one core; the
//! caller says how many threads (the domain decides nothing about the machine), and with one
//! thread nothing is spawned. Threads started here inherit the caller's scheduling priority, so
//! a rebuild lowered to nice 10 stays there whatever it fans out to; and each yields the core
//! after each item (a shard: a millisecond or two of work with millions of names), as the call
//! log's writer does between its batches, so a request worker that shares the core and is
//! runnable goes first (a no-op when none is waiting).

/// Runs `work` on every item of `items`, spread over at most `threads` threads (contiguous runs
/// of items each), and returns the results in the items' order.
pub fn for_each_split<T: Send, R: Send>(
    items: &mut [T],
    threads: usize,
    work: impl Fn(usize, &mut T) -> R + Sync,
) -> Vec<R> {
    let threads = threads.clamp(1, items.len().max(1));
    if threads == 1 {
        return items
            .iter_mut()
            .enumerate()
            .map(|(i, item)| piece(|| work(i, item)))
            .collect();
    }
    let per = items.len().div_ceil(threads);
    let work = &work;
    std::thread::scope(|scope| {
        let handles: Vec<_> = items
            .chunks_mut(per)
            .enumerate()
            .map(|(part, chunk)| {
                scope.spawn(move || {
                    chunk
                        .iter_mut()
                        .enumerate()
                        .map(|(i, item)| piece(|| work(part * per + i, item)))
                        .collect::<Vec<R>>()
                })
            })
            .collect();
        handles
            .into_iter()
            // A panic in a part is a bug of the build: carried to the caller as it is.
            .flat_map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    })
}

/// One piece of background work, then the core to a runnable worker, if any.
pub fn piece<R>(work: impl FnOnce() -> R) -> R {
    let done = work();
    std::thread::yield_now();
    done
}

/// `text` cut into at most `parts` runs of whole lines of about equal size (each but the last
/// ends with its `\n`), in order; an empty text gives no part.
pub fn line_runs(text: &str, parts: usize) -> Vec<&str> {
    let mut runs = Vec::with_capacity(parts);
    let target = text.len().div_ceil(parts.max(1)).max(1);
    let mut rest = text;
    while !rest.is_empty() {
        let cut = if rest.len() <= target {
            rest.len()
        } else {
            memchr::memchr(b'\n', &rest.as_bytes()[target..]).map_or(rest.len(), |i| target + i + 1)
        };
        let (run, tail) = rest.split_at(cut);
        runs.push(run);
        rest = tail;
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn results_keep_the_items_order_whatever_the_threads() {
        for threads in [0, 1, 2, 3, 8, 100] {
            let mut items: Vec<u32> = (0..37).collect();
            let out = for_each_split(&mut items, threads, |i, x| {
                *x += 1;
                (i, *x)
            });
            let expected: Vec<(usize, u32)> = (0..37).map(|i| (i, i as u32 + 1)).collect();
            assert_eq!(out, expected, "{threads} threads");
        }
        assert!(for_each_split(&mut Vec::<u8>::new(), 4, |_, _| ()).is_empty());
    }

    proptest! {
        #[test]
        fn line_runs_are_whole_lines_that_rebuild_the_text(
            lines in proptest::collection::vec("[a-z.]{0,12}", 0..60),
            end in any::<bool>(),
            parts in 1usize..9,
        ) {
            let mut text = lines.join("\n");
            if end && !text.is_empty() {
                text.push('\n');
            }
            let runs = line_runs(&text, parts);
            prop_assert_eq!(runs.concat(), text.clone());
            prop_assert!(runs.len() <= parts + 1);
            for run in &runs[..runs.len().saturating_sub(1)] {
                prop_assert!(run.ends_with('\n'));
            }
            prop_assert!(runs.iter().all(|r| !r.is_empty()));
        }
    }
}
