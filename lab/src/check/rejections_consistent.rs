//! Every refusal in `fence_rejections` is justified by its reason, and the token it lost to is
//! one the ledger shows accepted:
//!
//! * `stale-token`: token < max_token;
//! * `holder-mismatch`: token = max_token from another holder;
//! * `seq-not-forward`: the fence itself passed (token > max_token, or = from the same holder);
//! * `preempted`: a fenced transaction left open under token was ended by a writer of the higher
//!   max_token (`sql/0003_preempt.sql`), never an equal or higher one.
//!
//! A refusal that fails this is a fence deciding on the wrong facts; one whose `max_token` the
//! ledger never accepted means the ledger lost writes (or was edited).
//!
//! The fence is one row for all of a fleet's resources (`baton.fence_domain()`): the first write
//! of a new term on *any* resource fences the old term out of every one. So a refusal on
//! `workset` may cite a token the ledger shows accepted only on `sequence` (the new leader
//! claimed the sequence, then died before touching the work-set). The lookup is by
//! (token, holder), not by resource.

use std::collections::HashSet;

use super::{CheckInput, Rejection, Violation};

pub const NAME: &str = "rejections_consistent";

fn justified(r: &Rejection) -> Result<(), String> {
    match r.reason.as_str() {
        "stale-token" | "preempted" if r.token < r.max_token => Ok(()),
        "holder-mismatch" if r.token == r.max_token && r.holder != r.max_holder => Ok(()),
        "seq-not-forward"
            if r.token > r.max_token || (r.token == r.max_token && r.holder == r.max_holder) =>
        {
            Ok(())
        }
        "stale-token" | "holder-mismatch" | "seq-not-forward" | "preempted" => Err(format!(
            "refusal {} says {} but token {} (holder {}) vs max_token {} (holder {}) does not fit it",
            r.id, r.reason, r.token, r.holder, r.max_token, r.max_holder
        )),
        other => Err(format!("refusal {} has an unknown reason {other:?}", r.id)),
    }
}

pub fn check(input: &CheckInput) -> Option<Violation> {
    let accepted: HashSet<(i64, &str)> = input
        .ledger
        .iter()
        .map(|l| (l.token, l.holder.as_str()))
        .collect();
    for r in &input.rejections {
        let describe = format!(
            "refusal {}: {} {} token {} holder {} vs max_token {} holder {} ({}) at {}",
            r.id,
            r.resource,
            r.op,
            r.token,
            r.holder,
            r.max_token,
            r.max_holder,
            r.reason,
            super::fmt_us(r.at_us)
        );
        if let Err(msg) = justified(r) {
            return Some(Violation::new(NAME, msg, vec![describe]));
        }
        if r.max_token > 0 && !accepted.contains(&(r.max_token, r.max_holder.as_str())) {
            return Some(Violation::new(
                NAME,
                format!(
                    "refusal {} on {} lost to token {} (holder {}), which the ledger never shows accepted on any resource",
                    r.id, r.resource, r.max_token, r.max_holder
                ),
                vec![describe],
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::testkit::*;

    fn rej(
        id: i64,
        token: i64,
        max_token: i64,
        holder: &str,
        max_holder: &str,
        reason: &str,
    ) -> Rejection {
        Rejection {
            id,
            resource: "sequence".into(),
            token,
            max_token,
            holder: holder.into(),
            max_holder: max_holder.into(),
            op: "next".into(),
            reason: reason.into(),
            at_us: 0,
        }
    }

    #[test]
    fn justified_refusals_pass() {
        let mut input = healthy();
        input.rejections = vec![
            rej(1, 5, 7, "n1", "n2", "stale-token"),
            rej(2, 7, 7, "intruder", "n2", "holder-mismatch"),
            rej(3, 7, 7, "n2", "n2", "seq-not-forward"),
            rej(4, 6, 7, "n1", "n2", "preempted"),
        ];
        assert_eq!(check(&input), None);
    }

    /// The fence ends only a lower token's open transaction: an ending at an equal token is a
    /// writer ending its own term's (or a rival's) session.
    #[test]
    fn a_preemption_of_an_equal_token_fails() {
        let mut input = healthy();
        input.rejections = vec![rej(1, 7, 7, "n1", "n2", "preempted")];
        let v = check(&input).expect("violation");
        assert!(
            v.message.starts_with("refusal 1 says preempted"),
            "{}",
            v.message
        );
    }

    #[test]
    fn a_stale_token_refusal_with_a_newer_token_fails() {
        let mut input = healthy();
        input.rejections = vec![rej(1, 7, 5, "n2", "n1", "stale-token")];
        let v = check(&input).expect("violation");
        assert_eq!(v.invariant, NAME);
        assert!(
            v.message.starts_with("refusal 1 says stale-token"),
            "{}",
            v.message
        );
    }

    #[test]
    fn a_holder_mismatch_from_the_holder_itself_fails() {
        let mut input = healthy();
        input.rejections = vec![rej(4, 7, 7, "n2", "n2", "holder-mismatch")];
        assert!(check(&input).is_some());
    }

    #[test]
    fn losing_to_a_token_the_ledger_never_accepted_fails() {
        let mut input = healthy();
        input.rejections = vec![rej(1, 5, 8, "n1", "n3", "stale-token")];
        let v = check(&input).expect("violation");
        assert!(
            v.message.contains("lost to token 8 (holder n3)"),
            "{}",
            v.message
        );
    }

    /// Found by the nemesis (raft, seed 6123822392426128214): n2 claimed the sequence under
    /// token 18 and was killed before it touched the work-set; n1's tick on the work-set under
    /// token 17 was refused at max_token 18. The fence is one row for every resource, so that
    /// refusal is justified by the sequence's claim.
    #[test]
    fn a_refusal_on_one_resource_may_cite_a_token_accepted_on_another() {
        let mut input = healthy();
        let mut r = rej(1, 5, 7, "n1", "n2", "stale-token");
        r.resource = "workset".into();
        r.op = "tick".into();
        input.rejections = vec![r.clone()];
        assert_eq!(check(&input), None);
        // ... but not a token no resource ever accepted.
        r.max_token = 8;
        input.rejections = vec![r];
        let v = check(&input).expect("violation");
        assert!(v.message.contains("on any resource"), "{}", v.message);
    }

    #[test]
    fn unknown_reasons_fail() {
        let mut input = healthy();
        input.rejections = vec![rej(1, 5, 7, "n1", "n2", "because")];
        assert!(check(&input).unwrap().message.contains("unknown reason"));
    }
}
