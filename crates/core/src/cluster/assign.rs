//! Which consumer receives each drawn position. Every consumer receives
//! `batch / consumers` positions; the union is always the whole global draw.
//!
//! * [`Assignment::Iid`]: position j goes to consumer `floor(j · C / B)`, so each
//!   consumer's sub-batch is itself an iid draw;
//! * [`Assignment::Local`]: each consumer is filled first with positions whose
//!   shard is on its own host (in position order, consumers in their order), the
//!   rest go to consumers with room left, in order. Rows then cross hosts only for
//!   the imbalance between a host's drawn share and its consumers' share.

use crate::invalid;
use crate::Result;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Assignment {
    Iid,
    Local,
}

impl Assignment {
    pub fn from_name(name: &str) -> Option<Assignment> {
        match name {
            "iid" => Some(Assignment::Iid),
            "local" => Some(Assignment::Local),
            _ => None,
        }
    }
}

/// The consumer (an index into `consumer_host`) of every position. `shard` gives
/// each position's shard, `shard_host` each shard's host, `consumer_host` each
/// consumer's host.
pub fn assign(how: Assignment, shard: &[u32], shard_host: &[u32], consumer_host: &[u32]) -> Result<Vec<u32>> {
    let (batch, consumers) = (shard.len(), consumer_host.len());
    if consumers == 0 {
        return Err(invalid!("no consumer to receive the batch"));
    }
    if batch % consumers != 0 {
        return Err(invalid!(
            "batch_size {batch} does not split evenly over {consumers} consumers; expected a multiple of {consumers}"
        ));
    }
    if let Some(&s) = shard.iter().find(|&&s| s as usize >= shard_host.len()) {
        return Err(invalid!("position on shard {s}, but there are {} shards", shard_host.len()));
    }
    let quota = batch / consumers;
    if how == Assignment::Iid {
        return Ok((0..batch).map(|j| (j / quota) as u32).collect());
    }
    let hosts = consumer_host.iter().chain(shard_host).map(|&h| h as usize + 1).max().unwrap_or(0);
    // Per host: its consumers in order, and the next one that may have room.
    let mut on_host: Vec<Vec<u32>> = vec![Vec::new(); hosts];
    for (c, &h) in consumer_host.iter().enumerate() {
        on_host[h as usize].push(c as u32);
    }
    let mut next = vec![0usize; hosts];
    let mut room = vec![quota; consumers];
    let mut out = vec![u32::MAX; batch];
    for (j, &s) in shard.iter().enumerate() {
        let h = shard_host[s as usize] as usize;
        while next[h] < on_host[h].len() && room[on_host[h][next[h]] as usize] == 0 {
            next[h] += 1;
        }
        if let Some(&c) = on_host[h].get(next[h]) {
            out[j] = c;
            room[c as usize] -= 1;
        }
    }
    let mut c = 0usize;
    for slot in out.iter_mut().filter(|c| **c == u32::MAX) {
        while room[c] == 0 {
            c += 1;
        }
        *slot = c as u32;
        room[c] -= 1;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iid_cuts_the_batch_in_order() {
        assert_eq!(assign(Assignment::Iid, &[0, 1, 1, 0, 0, 1], &[0, 1], &[0, 1, 1]).unwrap(), vec![0, 0, 1, 1, 2, 2]);
    }

    #[test]
    fn local_fills_from_the_own_host_first() {
        // Two hosts, one consumer each; shard 0 on host 0, shard 1 on host 1.
        let shard = [0, 0, 0, 1, 0, 1];
        let got = assign(Assignment::Local, &shard, &[0, 1], &[0, 1]).unwrap();
        assert_eq!(got, vec![0, 0, 0, 1, 1, 1]);
        // Only the fourth host-0 position crosses.
        let crossing = got.iter().zip(&shard).filter(|(c, s)| c != s).count();
        assert_eq!(crossing, 1);
    }

    #[test]
    fn every_consumer_gets_its_quota() {
        let shard: Vec<u32> = (0..120).map(|j| (j * 7 % 3) as u32).collect();
        for how in [Assignment::Iid, Assignment::Local] {
            let got = assign(how, &shard, &[0, 0, 1], &[1, 0, 1, 0]).unwrap();
            for c in 0..4 {
                assert_eq!(got.iter().filter(|&&x| x == c).count(), 30);
            }
        }
    }

    #[test]
    fn refuses_uneven_batches() {
        let e = assign(Assignment::Iid, &[0, 0, 0], &[0], &[0, 0]).unwrap_err().to_string();
        assert!(e.contains("batch_size 3 does not split evenly over 2 consumers"), "{e}");
    }
}
