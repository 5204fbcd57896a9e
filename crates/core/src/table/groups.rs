//! Groups (GRPO's prompt groups): items that become sampleable together.
//!
//! With `group_size = G` every item names its group in its int64 attribute
//! `group`. A member that arrives waits, **pending**, in its slot (it has a key and
//! holds its rows, but no selector sees it) until all G members of its group are
//! in; then the group is **admitted**: its first member (the leader) enters the
//! sampler and remover with the sum of the members' priorities, and a draw of the
//! leader returns every member, side by side. A group still incomplete
//! `timeout` after its first member arrived is dropped or admitted as it is
//! (`OnTimeout`). A group leaves as a whole: eviction, `delete` of any member,
//! `max_times_sampled` (counted on the leader), staleness (a group is as old as
//! its oldest member) and store pressure all remove every member.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::attributes::Attributes;

/// What happens to a group still incomplete when its timeout passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnTimeout {
    /// Its members leave (counted in `groups_dropped`).
    Drop,
    /// It is admitted with the members it has (counted in `groups_partial`).
    Partial,
}

impl OnTimeout {
    pub fn name(self) -> &'static str {
        match self {
            OnTimeout::Drop => "drop",
            OnTimeout::Partial => "partial",
        }
    }

    pub fn from_name(name: &str) -> Option<OnTimeout> {
        match name {
            "drop" => Some(OnTimeout::Drop),
            "partial" => Some(OnTimeout::Partial),
            _ => None,
        }
    }
}

/// A table's group settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GroupConfig {
    /// Members of a complete group (>= 1).
    pub size: u32,
    /// How long a group may stay incomplete (None: for ever).
    pub timeout: Option<Duration>,
    pub on_timeout: OnTimeout,
}

/// The attribute that names an item's group.
pub const GROUP: &str = "group";

/// A slot's part in a group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    /// Not in any group's bookkeeping (a free slot).
    None,
    Pending,
    Leader,
    Member,
}

struct Pending {
    slots: Vec<u32>,
    since: Instant,
}

/// The groups of a table.
pub(crate) struct Groups {
    pub(crate) config: GroupConfig,
    offset: usize,
    role: Vec<Role>,
    /// Each slot's group id, while it has a role.
    id: Vec<i64>,
    pending: HashMap<i64, Pending>,
    /// First arrivals, oldest first (entries of groups no longer pending are skipped).
    arrivals: VecDeque<(Instant, i64)>,
    /// Admitted groups: id -> member slots, leader first.
    live: HashMap<i64, Vec<u32>>,
    pub(crate) admitted: u64,
    pub(crate) dropped: u64,
    pub(crate) partial: u64,
    pub(crate) duplicates: u64,
}

/// What a timeout check found: groups to drop, groups to admit as they are.
#[derive(Default)]
pub(crate) struct Expired {
    pub(crate) drop: Vec<Vec<u32>>,
    pub(crate) admit: Vec<Vec<u32>>,
}

impl Groups {
    /// Groups over `attributes` (which must have an int64 `group`; checked by the table).
    pub(crate) fn new(config: GroupConfig, attributes: &Attributes) -> Option<Groups> {
        let i = attributes.find(GROUP)?;
        Some(Groups {
            config,
            offset: attributes.offset(i),
            role: Vec::new(),
            id: Vec::new(),
            pending: HashMap::new(),
            arrivals: VecDeque::new(),
            live: HashMap::new(),
            admitted: 0,
            dropped: 0,
            partial: 0,
            duplicates: 0,
        })
    }

    pub(crate) fn id_of(&self, record: &[u8]) -> i64 {
        Attributes::read_i64(record, self.offset)
    }

    pub(crate) fn role(&self, slot: u32) -> Role {
        self.role.get(slot as usize).copied().unwrap_or(Role::None)
    }

    /// True when a member of group `id` may not arrive now: the group is
    /// admitted, or already has all its members pending.
    pub(crate) fn is_duplicate(&self, id: i64, arriving: usize) -> bool {
        self.live.contains_key(&id) || self.pending.get(&id).map_or(0, |p| p.slots.len()) + arriving > self.config.size as usize
    }

    /// Records that `slot` arrived for group `id` at `now`; returns the group's
    /// slots when it is now complete (they are admitted by the caller).
    pub(crate) fn arrived(&mut self, slot: u32, id: i64, now: Instant) -> Option<Vec<u32>> {
        self.set(slot, Role::Pending, id);
        let size = self.config.size as usize;
        let p = self.pending.entry(id).or_insert_with(|| Pending { slots: Vec::with_capacity(size), since: now });
        if p.slots.is_empty() {
            self.arrivals.push_back((now, id));
        }
        p.slots.push(slot);
        if p.slots.len() >= size {
            return self.pending.remove(&id).map(|p| p.slots);
        }
        None
    }

    /// Marks `slots` (of group `id`, leader first) admitted.
    pub(crate) fn admitted(&mut self, id: i64, slots: Vec<u32>, partial: bool) {
        for (k, &s) in slots.iter().enumerate() {
            self.set(s, if k == 0 { Role::Leader } else { Role::Member }, id);
        }
        self.live.insert(id, slots);
        self.admitted += 1;
        self.partial += partial as u64;
    }

    fn set(&mut self, slot: u32, role: Role, id: i64) {
        let s = slot as usize;
        if self.role.len() <= s {
            self.role.resize(s + 1, Role::None);
            self.id.resize(s + 1, 0);
        }
        self.role[s] = role;
        self.id[s] = id;
    }

    /// Every slot of the unit `slot` belongs to (its group, admitted or pending),
    /// taken out of the bookkeeping: the caller removes them.
    pub(crate) fn take_unit(&mut self, slot: u32) -> Vec<u32> {
        let (role, id) = (self.role(slot), self.id.get(slot as usize).copied().unwrap_or(0));
        let slots = match role {
            Role::None => vec![slot],
            Role::Pending => self.pending.remove(&id).map_or_else(|| vec![slot], |p| p.slots),
            Role::Leader | Role::Member => self.live.remove(&id).unwrap_or_else(|| vec![slot]),
        };
        for &s in &slots {
            self.set(s, Role::None, 0);
        }
        slots
    }

    /// A pending slot of group `id`, if the group is pending.
    pub(crate) fn pending_of(&self, id: i64) -> Option<u32> {
        self.pending.get(&id).map(|p| p.slots[0])
    }

    /// Puts back a pending member (a restored checkpoint), its timeout counted from `now`.
    pub(crate) fn restore_pending(&mut self, slot: u32, id: i64, now: Instant) {
        let done = self.arrived(slot, id, now);
        debug_assert!(done.is_none(), "a restored pending group is incomplete");
    }

    /// Each slot's role as a checkpoint keeps it: 0 no group, 1 leader, 2 member, 3 pending.
    pub(crate) fn role_code(&self, slot: u32) -> u8 {
        match self.role(slot) {
            Role::None => 0,
            Role::Leader => 1,
            Role::Member => 2,
            Role::Pending => 3,
        }
    }

    /// The members of the admitted group led by `leader`, leader first.
    pub(crate) fn members(&self, leader: u32) -> &[u32] {
        let id = self.id[leader as usize];
        self.live.get(&id).map_or(&[], |v| v.as_slice())
    }

    /// The leader of the admitted group `slot` is in (None: pending or no group).
    pub(crate) fn leader_of(&self, slot: u32) -> Option<u32> {
        match self.role(slot) {
            Role::Leader => Some(slot),
            Role::Member => self.live.get(&self.id[slot as usize]).map(|v| v[0]),
            _ => None,
        }
    }

    pub(crate) fn live_groups(&self) -> u64 {
        self.live.len() as u64
    }

    pub(crate) fn pending_groups(&self) -> u64 {
        self.pending.len() as u64
    }

    pub(crate) fn pending_items(&self) -> u64 {
        self.pending.values().map(|p| p.slots.len() as u64).sum()
    }

    /// The slots of every pending group (for `set_version`'s sweep).
    pub(crate) fn pending_slots(&self) -> impl Iterator<Item = &[u32]> {
        self.pending.values().map(|p| p.slots.as_slice())
    }

    /// When the oldest incomplete group times out (None: none will).
    pub(crate) fn next_expiry(&self) -> Option<Instant> {
        let timeout = self.config.timeout?;
        self.arrivals.iter().find(|(since, id)| self.pending.get(id).is_some_and(|p| p.since == *since)).map(|(s, _)| *s + timeout)
    }

    /// Takes out the groups whose timeout has passed at `now`.
    pub(crate) fn expire(&mut self, now: Instant) -> Expired {
        let mut out = Expired::default();
        let Some(timeout) = self.config.timeout else { return out };
        while let Some(&(since, id)) = self.arrivals.front() {
            let live = self.pending.get(&id).is_some_and(|p| p.since == since);
            if live && since + timeout > now {
                break;
            }
            self.arrivals.pop_front();
            if !live {
                continue;
            }
            let p = self.pending.remove(&id).expect("checked above");
            match self.config.on_timeout {
                OnTimeout::Drop => {
                    for &s in &p.slots {
                        self.set(s, Role::None, 0);
                    }
                    self.dropped += 1;
                    out.drop.push(p.slots);
                }
                OnTimeout::Partial => out.admit.push(p.slots),
            }
        }
        out
    }

    pub(crate) fn clear(&mut self) {
        self.role.clear();
        self.id.clear();
        self.pending.clear();
        self.arrivals.clear();
        self.live.clear();
    }

    /// The figures `info()["groups"]` reports.
    pub(crate) fn info(&self) -> Value {
        json!({
            "group_size": self.config.size,
            "timeout": self.config.timeout.map(|t| t.as_secs_f64()),
            "on_timeout": self.config.on_timeout.name(),
            "live": self.live_groups(),
            "pending": self.pending_groups(),
            "pending_items": self.pending_items(),
            "admitted": self.admitted,
            "dropped": self.dropped,
            "partial": self.partial,
            "duplicates": self.duplicates,
        })
    }

    /// The counters a checkpoint keeps (the groups are rebuilt from the items).
    pub(crate) fn save(&self) -> Value {
        json!({"admitted": self.admitted, "dropped": self.dropped, "partial": self.partial, "duplicates": self.duplicates})
    }

    pub(crate) fn restore_counters(&mut self, saved: &Value) -> Result<(), String> {
        let count = |name: &str| saved.get(name).and_then(Value::as_u64).ok_or_else(|| format!("groups: '{name}' missing or not a count"));
        self.admitted = count("admitted")?;
        self.dropped = count("dropped")?;
        self.partial = count("partial")?;
        self.duplicates = count("duplicates")?;
        Ok(())
    }
}
