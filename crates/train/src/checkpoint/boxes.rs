//! Boxes of a global tensor and the contiguous runs two row-major buffers share: the index
//! arithmetic of writing a device's shard (its data, not its padding) and of reading the
//! part of a saved shard that a device of another mesh needs.

use runtime::BlockDim;

/// A box of a global tensor: per dim, `[offset, offset + len)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Region {
    pub offset: Vec<usize>,
    pub len: Vec<usize>,
}

impl Region {
    /// The data of a device's block (not its padding).
    pub fn of_block(block: &[BlockDim]) -> Region {
        Region {
            offset: block.iter().map(|b| b.offset).collect(),
            len: block.iter().map(|b| b.len).collect(),
        }
    }

    /// The whole of a tensor of `shape`.
    pub fn whole(shape: &[usize]) -> Region {
        Region {
            offset: vec![0; shape.len()],
            len: shape.to_vec(),
        }
    }

    pub fn elements(&self) -> usize {
        self.len.iter().product()
    }

    /// The common part, or `None` when it is empty.
    pub fn intersect(&self, other: &Region) -> Option<Region> {
        let mut offset = Vec::with_capacity(self.len.len());
        let mut len = Vec::with_capacity(self.len.len());
        for d in 0..self.len.len() {
            let lo = self.offset[d].max(other.offset[d]);
            let hi = (self.offset[d] + self.len[d]).min(other.offset[d] + other.len[d]);
            if hi <= lo {
                return None;
            }
            offset.push(lo);
            len.push(hi - lo);
        }
        Some(Region { offset, len })
    }

    /// Whether `self` lies inside a tensor of `shape`.
    pub fn within(&self, shape: &[usize]) -> bool {
        self.len.len() == shape.len()
            && (0..shape.len()).all(|d| {
                self.offset[d]
                    .checked_add(self.len[d])
                    .is_some_and(|end| end <= shape[d])
            })
    }
}

/// A row-major buffer holding a box of the global tensor: global coordinates `origin + i`
/// for `i < shape` (the shape may be larger than the data: padding).
#[derive(Clone, Copy, Debug)]
pub struct Frame<'a> {
    pub origin: &'a [usize],
    pub shape: &'a [usize],
}

/// Visit `part` (inside both frames' data) as contiguous runs: `f(index in a, index in b,
/// run length)` in elements, in increasing order of both indices. Trailing dims that `part`
/// and both frames cover whole merge into one run.
pub fn for_each_run<E>(
    part: &Region,
    a: Frame,
    b: Frame,
    mut f: impl FnMut(usize, usize, usize) -> Result<(), E>,
) -> Result<(), E> {
    let rank = part.len.len();
    if rank == 0 {
        return f(0, 0, 1);
    }
    if part.len.contains(&0) {
        return Ok(());
    }
    // `k`: the first dim of the run; every dim after it is whole in `part`, `a` and `b`.
    let mut k = rank - 1;
    while k > 0 && part.len[k] == a.shape[k] && part.len[k] == b.shape[k] {
        k -= 1;
    }
    let run: usize = part.len[k..].iter().product();
    let (sa, sb) = (ir::strides(a.shape), ir::strides(b.shape));
    let mut c = vec![0usize; k];
    loop {
        let (mut ia, mut ib) = (0, 0);
        for d in 0..rank {
            let g = part.offset[d] + if d < k { c[d] } else { 0 };
            ia += (g - a.origin[d]) * sa[d];
            ib += (g - b.origin[d]) * sb[d];
        }
        f(ia, ib, run)?;
        let mut d = k;
        loop {
            if d == 0 {
                return Ok(());
            }
            d -= 1;
            c[d] += 1;
            if c[d] < part.len[d] {
                break;
            }
            c[d] = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every element of `part` by itself: (index in a, index in b).
    fn naive(part: &Region, a: Frame, b: Frame) -> Vec<(usize, usize)> {
        let (sa, sb) = (ir::strides(a.shape), ir::strides(b.shape));
        let n = part.elements();
        let ps = ir::strides(&part.len);
        (0..n)
            .map(|i| {
                let (mut ia, mut ib) = (0, 0);
                for d in 0..part.len.len() {
                    let g = part.offset[d] + i / ps[d] % part.len[d];
                    ia += (g - a.origin[d]) * sa[d];
                    ib += (g - b.origin[d]) * sb[d];
                }
                (ia, ib)
            })
            .collect()
    }

    #[test]
    fn runs_visit_every_element_of_the_part_once_in_order() {
        type Case = (Region, Vec<usize>, Vec<usize>, Vec<usize>, Vec<usize>);
        let cases: Vec<Case> = vec![
            // part, a origin, a shape, b origin, b shape
            (
                Region::whole(&[4, 6]),
                vec![0, 0],
                vec![4, 6],
                vec![0, 0],
                vec![4, 6],
            ),
            (
                Region {
                    offset: vec![2, 0],
                    len: vec![2, 6],
                },
                vec![0, 0],
                vec![4, 6],
                vec![2, 0],
                vec![3, 6],
            ),
            (
                Region {
                    offset: vec![1, 2, 3],
                    len: vec![2, 2, 1],
                },
                vec![0, 0, 2],
                vec![4, 4, 4],
                vec![1, 1, 3],
                vec![3, 3, 1],
            ),
            (Region::whole(&[]), vec![], vec![], vec![], vec![]),
        ];
        for (part, ao, ash, bo, bsh) in cases {
            let a = Frame {
                origin: &ao,
                shape: &ash,
            };
            let b = Frame {
                origin: &bo,
                shape: &bsh,
            };
            let mut got = Vec::new();
            for_each_run::<()>(&part, a, b, |ia, ib, n| {
                got.extend((0..n).map(|j| (ia + j, ib + j)));
                Ok(())
            })
            .unwrap();
            assert_eq!(got, naive(&part, a, b), "{part:?}");
        }
    }

    #[test]
    fn intersections_are_the_common_box() {
        let a = Region {
            offset: vec![0, 2],
            len: vec![4, 4],
        };
        let b = Region {
            offset: vec![2, 0],
            len: vec![4, 3],
        };
        assert_eq!(
            a.intersect(&b),
            Some(Region {
                offset: vec![2, 2],
                len: vec![2, 1]
            })
        );
        let c = Region {
            offset: vec![0, 6],
            len: vec![1, 1],
        };
        assert_eq!(a.intersect(&c), None);
        assert!(a.within(&[4, 6]) && !a.within(&[4, 5]));
    }
}
