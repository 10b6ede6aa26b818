//! The loaders on real-world lists: the community blocklist and allowlist the gateway ships
//! (`data/community/`), and the old willwhite/freemail list kept as a test fixture
//! (`tests/fixtures/freemail/`, not shipped). All are in the repository: nothing here skips.

use std::path::Path;

use drg_domain::sources::add_domain_list;
use drg_domain::{classify, DomainName, ListKind, Reason, Scores, TableBuilder};

/// A file of the repository, by its path from the crate root.
fn read(file: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

const BLOCKLIST: &str = "data/community/disposable-email-domains/disposable_email_blocklist.conf";
const ALLOWLIST: &str = "data/community/disposable-email-domains/allowlist.conf";
const OLD_FREE_LIST: &str = "tests/fixtures/freemail/free.txt";

#[test]
fn community_blocklist_and_allowlist_load_and_classify() {
    let (block, allow) = (read(BLOCKLIST), read(ALLOWLIST));
    let mut b = TableBuilder::new();
    let n = add_domain_list(&mut b, &block, "blocklist", ListKind::Disposable).unwrap();
    assert_eq!(n, block.lines().count(), "every line is a domain");
    let a = add_domain_list(&mut b, &allow, "allowlist", ListKind::Allow).unwrap();
    assert_eq!(a, allow.lines().count());
    let table = b.build(Scores::default());
    // No domain is on both lists, so nothing was resolved.
    assert!(
        table.stats().conflicts.is_empty(),
        "{:?}",
        table.stats().conflicts
    );
    assert_eq!(
        table.stats().disposable + table.stats().skipped_public_suffixes,
        n
    );

    let first = block.lines().next().unwrap();
    let name = DomainName::parse(&format!("deep.sub.{first}")).unwrap();
    assert_eq!(
        classify(&table, &name, None).record.reason,
        Reason::Disposable
    );
    for line in block.lines().filter(|l| l.contains("xn--")) {
        let name = DomainName::parse(line).unwrap();
        assert_eq!(
            name.as_str(),
            line,
            "punycode entries are canonical already"
        );
        assert_eq!(
            classify(&table, &name, None).record.reason,
            Reason::Disposable
        );
    }
    let allowed = DomainName::parse(allow.lines().next().unwrap()).unwrap();
    assert_eq!(classify(&table, &allowed, None).record.reason, Reason::Safe);
}

#[test]
fn old_free_list_is_rejected_at_its_first_non_domain() {
    let free = read(OLD_FREE_LIST);
    let bad_line = free
        .lines()
        .position(|l| DomainName::parse(l).is_err())
        .expect("the 2020 list has non-domain lines")
        + 1;
    let mut b = TableBuilder::new();
    let err = add_domain_list(&mut b, &free, "free.txt", ListKind::FreeProvider).unwrap_err();
    assert_eq!(err.line, bad_line, "{err}");
    assert!(
        err.to_string()
            .starts_with(&format!("free.txt:{bad_line}: '")),
        "{err}"
    );
}

#[test]
fn free_list_wins_over_the_blocklist_where_they_overlap() {
    let (block, free) = (read(BLOCKLIST), read(OLD_FREE_LIST));
    let mut b = TableBuilder::new();
    add_domain_list(&mut b, &block, "blocklist", ListKind::Disposable).unwrap();
    let valid: String = free
        .lines()
        .filter(|l| DomainName::parse(l).is_ok())
        .map(|l| format!("{l}\n"))
        .collect();
    add_domain_list(&mut b, &valid, "free.txt", ListKind::FreeProvider).unwrap();
    let table = b.build(Scores::default());
    let conflicts = &table.stats().conflicts;
    // 10 of its names are on the blocklist too (tests/fixtures/freemail/README.md).
    assert_eq!(conflicts.len(), 10, "{conflicts:?}");
    for c in conflicts {
        let name = DomainName::parse(&c.domain).unwrap();
        let v = classify(&table, &name, None);
        assert_eq!(v.record.reason, Reason::Safe, "{}", c.domain);
        assert!(v.record.is_free_provider);
    }
}
