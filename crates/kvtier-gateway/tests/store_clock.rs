//! The gateway's store reads wall time from the clock it is given: buckets, parts and
//! completed uploads carry the injected dates, and keep them across a reopen. Days pass
//! by moving a mock clock; a store that read the system's clock would fail here.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests"
)]

use std::time::Duration;

use kvtier_core::clock::MockClock;
use kvtier_gateway::store::{Completed, GatewayStore, ObjectInfo, Precondition};
use kvtier_ssd::StoreConfig;

/// 2001-09-09 01:46:40 UTC.
const LONG_AGO: Duration = Duration::from_secs(1_000_000_000);
const DAY: Duration = Duration::from_secs(24 * 3600);

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

#[test]
fn stamps_come_from_the_injected_clock_and_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let clock = MockClock::at_wall(LONG_AGO);
    {
        let (s, _) =
            GatewayStore::open_with_clock(dir.path(), StoreConfig::default(), clock.clone())
                .unwrap();
        s.create_bucket("b").unwrap();

        clock.advance(DAY);
        let info = ObjectInfo {
            modified_ms: s.now_ms(),
            ..ObjectInfo::default()
        };
        let id = s.create_upload("b", "k", info).unwrap();
        let mut w = s.begin_part(&id, "b", "k", 1, 5).unwrap();
        w.write(b"hello").unwrap();
        let etag = s.finish_part(w, &id, 1).unwrap();
        let (parts, _) = s.list_parts(&id, "b", "k", 0, 10).unwrap();
        assert_eq!(parts[0].modified_ms, ms(LONG_AGO + DAY));
        let uploads = s.list_uploads("b", "", "", "").unwrap();
        assert_eq!(uploads[0].initiated_ms, ms(LONG_AGO + DAY));

        clock.advance(DAY);
        let done = s
            .complete_upload(&id, "b", "k", &[(1, etag)], &Precondition::default())
            .unwrap();
        let Completed::Now(object) = done else {
            panic!("a first completion completes now");
        };
        assert_eq!(object.info.modified_ms, ms(LONG_AGO + 2 * DAY));
        assert_eq!(s.buckets(), vec![("b".to_string(), ms(LONG_AGO))]);
    }
    // Reopened on the system clock: what was stamped keeps its date.
    let (s, _) = GatewayStore::open(dir.path(), StoreConfig::default()).unwrap();
    assert_eq!(s.buckets(), vec![("b".to_string(), ms(LONG_AGO))]);
    let object = s.object("b", "k").unwrap();
    assert_eq!(object.info.modified_ms, ms(LONG_AGO + 2 * DAY));
    assert!(s.now_ms() > ms(LONG_AGO + 365 * DAY));
}
