//! Work spread over scoped threads in contiguous shares, written once for the frame
//! encoder, the frame decoder and the coder's decode of several frames.

/// Runs `work` on contiguous shares of `items`, one share per scoped thread (at most
/// `threads` of them), and gives back each share's result in order; `None` for a share
/// whose thread panicked.
pub(crate) fn in_shares<T: Send, R: Send>(
    mut items: Vec<T>,
    threads: usize,
    work: impl Fn(Vec<T>) -> R + Sync,
) -> Vec<Option<R>> {
    let per = items.len().div_ceil(threads.max(1)).max(1);
    let work = &work;
    std::thread::scope(|scope| {
        let mut handles = Vec::with_capacity(threads);
        while !items.is_empty() {
            let rest = items.split_off(per.min(items.len()));
            let share = std::mem::replace(&mut items, rest);
            handles.push(scope.spawn(move || work(share)));
        }
        handles.into_iter().map(|h| h.join().ok()).collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_item_is_worked_on_once_in_order_of_shares() {
        for threads in [1, 2, 3, 8] {
            let items: Vec<u32> = (0..10).collect();
            let shares = in_shares(items, threads, |share| share);
            assert!(shares.len() <= threads);
            let flat: Vec<u32> = shares.into_iter().flat_map(Option::unwrap).collect();
            assert_eq!(flat, (0..10).collect::<Vec<_>>());
        }
    }

    #[test]
    fn a_share_that_panics_is_none_and_the_others_still_come_back() {
        let shares = in_shares(vec![1, 2, 3, 4], 2, |share| {
            assert!(!share.contains(&4), "fault injected by the test");
            share.len()
        });
        assert_eq!(shares, vec![Some(2), None]);
    }
}
