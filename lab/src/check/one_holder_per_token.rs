//! Every token was written under one holder only, across every resource. Two holders on one
//! token means two nodes believed they held the same term: a regressing or duplicated token
//! source (what `redis-naive` can produce), or a fence that ignored the holder.

use std::collections::HashMap;

use super::{CheckInput, LedgerRow, Violation};

pub const NAME: &str = "one_holder_per_token";

pub fn check(input: &CheckInput) -> Option<Violation> {
    let mut first: HashMap<i64, &LedgerRow> = HashMap::new();
    for row in &input.ledger {
        match first.get(&row.token) {
            Some(f) if f.holder != row.holder => {
                return Some(Violation::new(
                    NAME,
                    format!(
                        "token {} written by holder {} at pos {} and by holder {} at pos {}",
                        row.token, f.holder, f.pos, row.holder, row.pos
                    ),
                    vec![
                        format!("first holder:  {}", f.describe()),
                        format!("second holder: {}", row.describe()),
                    ],
                ));
            }
            Some(_) => {}
            None => {
                first.insert(row.token, row);
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
    fn passes_with_one_holder_each() {
        assert_eq!(check(&healthy()), None);
    }

    #[test]
    fn a_second_holder_on_the_same_token_fails() {
        let mut input = healthy();
        input.ledger.push(next(7, 7, "n3", 10, 10));
        let v = check(&input).expect("violation");
        assert_eq!(v.invariant, NAME);
        assert_eq!(
            v.message,
            "token 7 written by holder n2 at pos 4 and by holder n3 at pos 7"
        );
    }

    #[test]
    fn applies_across_resources() {
        let mut input = healthy();
        let mut row = claim(7, 5, "n9", 0);
        row.resource = "workset".into();
        input.ledger.push(row);
        let v = check(&input).expect("violation");
        assert!(
            v.message
                .contains("token 5 written by holder n1 at pos 1 and by holder n9 at pos 7"),
            "{}",
            v.message
        );
    }
}
