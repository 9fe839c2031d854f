//! Per resource, in commit order (`pos`), the token never decreases: once the resource accepted
//! token T, nothing older is ever accepted again. A decrease is a stale leader's write that got
//! through — exactly what the fence exists to prevent.

use std::collections::HashMap;

use super::{CheckInput, LedgerRow, Violation};

pub const NAME: &str = "token_order";

pub fn check(input: &CheckInput) -> Option<Violation> {
    // resource -> the row that set the highest token so far.
    let mut high: HashMap<&str, &LedgerRow> = HashMap::new();
    for row in &input.ledger {
        match high.get(row.resource.as_str()) {
            Some(prev) if row.token < prev.token => {
                return Some(Violation::new(
                    NAME,
                    format!(
                        "resource {} accepted token {} (holder {}) at pos {} after token {} (holder {}) at pos {}",
                        row.resource, row.token, row.holder, row.pos, prev.token, prev.holder, prev.pos
                    ),
                    vec![
                        format!("highest before: {}", prev.describe()),
                        format!("went back:      {}", row.describe()),
                    ],
                ));
            }
            Some(prev) if row.token == prev.token => {}
            _ => {
                high.insert(row.resource.as_str(), row);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::testkit::*;

    #[test]
    fn passes_when_tokens_only_rise() {
        assert_eq!(check(&healthy()), None);
    }

    #[test]
    fn a_stale_token_after_a_newer_one_fails_with_both_rows() {
        let mut input = healthy();
        input.ledger.push(next(7, 5, "n1", 10, 10));
        let v = check(&input).expect("violation");
        assert_eq!(v.invariant, NAME);
        assert!(
            v.message.contains(
                "accepted token 5 (holder n1) at pos 7 after token 7 (holder n2) at pos 4"
            ),
            "{}",
            v.message
        );
        assert_eq!(v.context.len(), 2);
    }

    #[test]
    fn reports_the_first_decrease_only() {
        let mut input = healthy();
        input.ledger.push(next(7, 6, "n3", 10, 10));
        input.ledger.push(next(8, 1, "n4", 11, 11));
        let v = check(&input).expect("violation");
        assert!(
            v.message.contains("token 6") && v.message.contains("pos 7"),
            "{}",
            v.message
        );
    }

    #[test]
    fn resources_are_independent() {
        let mut input = healthy();
        // Another resource may still be at an older token.
        let mut row = next(7, 5, "n1", 1, 1);
        row.resource = "workset".into();
        row.op = "tick".into();
        input.ledger.push(row);
        assert_eq!(check(&input), None);
    }
}
