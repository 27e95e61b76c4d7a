//! The one byte-range splitter: cuts a run of byte ranges (transfer descriptors, memory copies,
//! `iovec` pairs) into parts of about equal bytes, cutting a range where a part is full. TCP
//! batches use it to spread over lanes, the same-host path to share a batch with its helper.

/// A byte range that can be cut in two.
pub(crate) trait Cut: Copy {
    /// How many bytes it covers.
    fn bytes(&self) -> u64;
    /// Its first `at` bytes (`0 < at < bytes()`) and the rest.
    fn cut(&self, at: u64) -> (Self, Self);
}

/// Splits `items` into at most `parts` runs of at most `ceil(total / parts)` bytes each, in
/// order, cutting an item where a run is full; empty items are left out. Every byte is in
/// exactly one run, at its place.
pub(crate) fn split<T: Cut>(items: &[T], parts: usize) -> Vec<Vec<T>> {
    let total: u64 = items.iter().map(Cut::bytes).sum();
    let share = total.div_ceil(parts.max(1) as u64).max(1);
    // each run holds about its share of the items (and the pieces of one cut at its ends)
    let per = items.len() / parts.max(1) + 2;
    let mut out: Vec<Vec<T>> = Vec::with_capacity(parts.max(1) + 1);
    out.push(Vec::with_capacity(per));
    let mut room = share;
    for item in items {
        let mut rest = *item;
        while rest.bytes() > 0 {
            if room == 0 {
                out.push(Vec::with_capacity(per));
                room = share;
            }
            let last = out.last_mut().expect("at least one run");
            if rest.bytes() <= room {
                room -= rest.bytes();
                last.push(rest);
                break;
            }
            let (head, tail) = rest.cut(room);
            last.push(head);
            room = 0;
            rest = tail;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Copy, Debug, PartialEq)]
    struct R(u64, u64); // start, len
    impl Cut for R {
        fn bytes(&self) -> u64 {
            self.1
        }
        fn cut(&self, at: u64) -> (Self, Self) {
            (R(self.0, at), R(self.0 + at, self.1 - at))
        }
    }

    #[test]
    fn every_byte_once_in_order_and_parts_bounded() {
        let cases: Vec<(Vec<R>, usize)> = vec![
            (vec![R(0, 10)], 3),
            (vec![R(0, 7), R(100, 0), R(200, 9), R(300, 1)], 2),
            (vec![R(0, 1), R(1, 1), R(2, 1)], 5),
            ((0..50).map(|i| R(i * 1000, i % 7 + 1)).collect(), 4),
        ];
        for (items, parts) in cases {
            let out = split(&items, parts);
            let total: u64 = items.iter().map(|r| r.1).sum();
            let share = total.div_ceil(parts as u64);
            assert!(out.len() <= parts, "{out:?}");
            assert!(
                out.iter()
                    .all(|p| p.iter().map(|r| r.1).sum::<u64>() <= share)
            );
            // concatenated, the runs cover every byte once and in order
            let flat: Vec<u64> = out.iter().flatten().flat_map(|r| r.0..r.0 + r.1).collect();
            let want: Vec<u64> = items.iter().flat_map(|r| r.0..r.0 + r.1).collect();
            assert_eq!(flat, want);
        }
    }
}
