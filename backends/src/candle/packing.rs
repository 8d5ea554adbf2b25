//! Which prefixes of a batched prefill share a forward pass.
//!
//! In: the prefixes' lengths and a token budget per pass. Out: a [`PackPlan`]: passes of
//! prefixes packed back to back (each pass at most `budget` tokens) and the prefixes that run
//! alone through the chunked prefill (longer than the budget, or empty — the chunked path
//! reports the error). Whether a prefix is packed depends only on its own length, so its
//! numerics never depend on the other prefixes of the call.

/// Passes of packed prefixes (indices into the caller's list) and the prefixes prefilled alone.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct PackPlan {
    pub passes: Vec<Vec<usize>>,
    pub alone: Vec<usize>,
}

/// First-fit decreasing: longest prefixes first, each into the first pass with room for it, so
/// passes come out nearly full. Ties keep input order; every index lands exactly once.
pub(crate) fn plan(lens: impl IntoIterator<Item = usize>, budget: usize) -> PackPlan {
    let lens: Vec<usize> = lens.into_iter().collect();
    let mut order: Vec<usize> = (0..lens.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(lens[i]));
    let mut plan = PackPlan::default();
    let mut room: Vec<usize> = Vec::new();
    for i in order {
        let n = lens[i];
        if n == 0 || n > budget {
            plan.alone.push(i);
            continue;
        }
        match room.iter().position(|&r| r >= n) {
            Some(p) => {
                room[p] -= n;
                plan.passes[p].push(i);
            }
            None => {
                room.push(budget - n);
                plan.passes.push(vec![i]);
            }
        }
    }
    plan.alone.sort_unstable();
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn long_and_empty_prefixes_run_alone() {
        let p = plan([3, 10, 0, 4, 11], 10);
        assert_eq!(p.alone, vec![2, 4]);
        assert_eq!(p.passes, vec![vec![1], vec![3, 0]]);
    }

    proptest! {
        #[test]
        fn every_prefix_lands_once_and_passes_fit(
            lens in proptest::collection::vec(0usize..40, 0..30),
            budget in 1usize..64,
        ) {
            let p = plan(lens.iter().copied(), budget);
            let mut seen = vec![0u32; lens.len()];
            for pass in &p.passes {
                prop_assert!(!pass.is_empty());
                prop_assert!(pass.iter().map(|&i| lens[i]).sum::<usize>() <= budget);
                for &i in pass {
                    prop_assert!(lens[i] > 0 && lens[i] <= budget);
                    seen[i] += 1;
                }
            }
            for &i in &p.alone {
                prop_assert!(lens[i] == 0 || lens[i] > budget);
                seen[i] += 1;
            }
            prop_assert!(seen.iter().all(|&c| c == 1));
        }
    }
}
