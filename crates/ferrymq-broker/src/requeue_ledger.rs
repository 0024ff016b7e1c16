//! Which messages of a dead-letter topic were requeued, as runs of offsets per partition. A
//! leaf module: the topic keeps its ledger, and the requeue above it reads and extends it.

use std::collections::{BTreeMap, HashMap};

/// The requeued offsets of one dead-letter topic, kept with the topic (a topic deleted and
/// created again starts with an empty one). Its lock also keeps two requeues of one topic from
/// racing.
#[derive(Default)]
pub(crate) struct Ledger {
    /// Disk topics: the runs were read from the metadata store.
    pub loaded: bool,
    /// Per partition: inclusive runs, ascending, disjoint and not adjacent.
    pub runs: HashMap<u32, Vec<(u64, u64)>>,
    /// Per partition: where each requeued dead letter went, its copy's (partition, offset) in
    /// the source topic. At most one per retained dead letter; pruned with the runs. Dead letters
    /// requeued before copies were recorded are in `runs` only.
    pub copies: HashMap<u32, BTreeMap<u64, (u32, u64)>>,
}

pub(crate) fn runs_contain(runs: &[(u64, u64)], offset: u64) -> bool {
    let i = runs.partition_point(|r| r.1 < offset);
    i < runs.len() && runs[i].0 <= offset
}

pub(crate) fn runs_insert(runs: &mut Vec<(u64, u64)>, offset: u64) {
    // The first run that ends at or after `offset`; the one before ends below it.
    let i = runs.partition_point(|r| r.1 < offset);
    if i < runs.len() && runs[i].0 <= offset {
        return;
    }
    let joins_prev = i > 0 && runs[i - 1].1 + 1 == offset;
    let joins_next = i < runs.len() && offset + 1 == runs[i].0;
    match (joins_prev, joins_next) {
        (true, true) => {
            runs[i - 1].1 = runs[i].1;
            runs.remove(i);
        }
        (true, false) => runs[i - 1].1 = offset,
        (false, true) => runs[i].0 = offset,
        (false, false) => runs.insert(i, (offset, offset)),
    }
}

/// Forgets the runs below `start` (offsets the partition no longer retains).
pub(crate) fn runs_prune(runs: &mut Vec<(u64, u64)>, start: u64) {
    runs.retain(|r| r.1 >= start);
    if let Some(first) = runs.first_mut() {
        first.0 = first.0.max(start);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_merge_in_any_order() {
        let mut runs = Vec::new();
        for offset in [5, 3, 4, 9, 7, 8, 0, 4, u64::MAX] {
            runs_insert(&mut runs, offset);
        }
        assert_eq!(runs, vec![(0, 0), (3, 5), (7, 9), (u64::MAX, u64::MAX)]);
        runs_insert(&mut runs, 6);
        assert_eq!(runs, vec![(0, 0), (3, 9), (u64::MAX, u64::MAX)]);
        for (offset, inside) in [(0, true), (1, false), (3, true), (9, true), (10, false)] {
            assert_eq!(runs_contain(&runs, offset), inside, "{offset}");
        }
        runs_prune(&mut runs, 4);
        assert_eq!(runs, vec![(4, 9), (u64::MAX, u64::MAX)]);
        runs_prune(&mut runs, 10);
        assert_eq!(runs, vec![(u64::MAX, u64::MAX)]);
    }
}
