//! Fuzzing the nldev answer parser with what a broken kernel (or a hostile netlink peer) could
//! send: arbitrary bytes, valid answers with bytes flipped, cut or spliced, and answers generated
//! from arbitrary entries.
//!
//! Nothing panics. What comes back is bounded by the input: no more entries than attribute
//! headers fit in the bytes, no string longer than the cut ([`MAX_NAME`] bytes, at most tripled
//! by lossy UTF-8). Answers generated from entries parse back to exactly those entries (the
//! messages here are laid out from `struct nlmsghdr`/`struct nlattr` and the header's attribute
//! numbers, not by the crate's encoder).

use erdma_usage::nldev::{
    self, AnswerError, MAX_NAME, MrEntry, QpEntry, QpState, QpType, cmd, parse_answer,
};
use proptest::prelude::*;

fn nla(kind: u16, payload: &[u8]) -> Vec<u8> {
    let len = 4 + payload.len();
    let mut v = Vec::with_capacity(len + 3);
    v.extend_from_slice(&(len as u16).to_ne_bytes());
    v.extend_from_slice(&kind.to_ne_bytes());
    v.extend_from_slice(payload);
    while v.len() % 4 != 0 {
        v.push(0);
    }
    v
}

fn s(x: &str) -> Vec<u8> {
    let mut v = x.as_bytes().to_vec();
    v.push(0);
    v
}

fn msg(op: u16, flags: u16, seq: u32, payload: &[u8]) -> Vec<u8> {
    let ty = if op < 16 && op != 0 && flags == 0xffff {
        op
    } else {
        5 * 1024 + op
    };
    let mut v = Vec::new();
    v.extend_from_slice(&((16 + payload.len()) as u32).to_ne_bytes());
    v.extend_from_slice(&ty.to_ne_bytes());
    v.extend_from_slice(&flags.to_ne_bytes());
    v.extend_from_slice(&seq.to_ne_bytes());
    v.extend_from_slice(&0u32.to_ne_bytes());
    v.extend_from_slice(payload);
    v
}

fn done(seq: u32) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&20u32.to_ne_bytes());
    v.extend_from_slice(&3u16.to_ne_bytes());
    v.extend_from_slice(&2u16.to_ne_bytes());
    v.extend_from_slice(&seq.to_ne_bytes());
    v.extend_from_slice(&0u32.to_ne_bytes());
    v.extend_from_slice(&0i32.to_ne_bytes());
    v
}

/// RES_QP_GET answer: DEV_INDEX(1), DEV_NAME(2), RES_QP(19) { RES_QP_ENTRY(20) {..} }.
fn qp_message(seq: u32, dev_index: u32, dev_name: &str, qps: &[QpEntry]) -> Vec<u8> {
    let entries: Vec<u8> = qps
        .iter()
        .flat_map(|q| {
            let mut e = Vec::new();
            if let Some(p) = q.port {
                e.extend(nla(3, &p.to_ne_bytes()));
            }
            e.extend(nla(21, &q.lqpn.to_ne_bytes()));
            e.extend(nla(23, &0u32.to_ne_bytes())); // RQ_PSN, ignored
            if let Some(p) = q.pid {
                e.extend(nla(28, &p.to_ne_bytes()));
            }
            if let Some(k) = &q.kern_name {
                e.extend(nla(29, &s(k)));
            }
            e.extend(nla(26, &[raw_type(q.qp_type)]));
            e.extend(nla(27, &[raw_state(q.state)]));
            nla(20, &e)
        })
        .collect();
    let body = [
        nla(1, &dev_index.to_ne_bytes()),
        nla(2, &s(dev_name)),
        nla(19, &entries),
    ]
    .concat();
    msg(cmd::RES_QP_GET, 2, seq, &body)
}

/// RES_MR_GET answer: RES_MR(40) { RES_MR_ENTRY(41) { MRLEN(45) u64 after a PAD(0), ... } }.
fn mr_message(seq: u32, dev_index: u32, dev_name: &str, mrs: &[MrEntry]) -> Vec<u8> {
    let entries: Vec<u8> = mrs
        .iter()
        .flat_map(|m| {
            let mut e = Vec::new();
            e.extend(nla(0, &[]));
            e.extend(nla(45, &m.mr_len.to_ne_bytes()));
            if let Some(n) = m.mrn {
                e.extend(nla(62, &n.to_ne_bytes()));
            }
            if let Some(n) = m.pdn {
                e.extend(nla(60, &n.to_ne_bytes()));
            }
            if let Some(p) = m.pid {
                e.extend(nla(28, &p.to_ne_bytes()));
            }
            if let Some(k) = &m.kern_name {
                e.extend(nla(29, &s(k)));
            }
            nla(41, &e)
        })
        .collect();
    let body = [
        nla(1, &dev_index.to_ne_bytes()),
        nla(2, &s(dev_name)),
        nla(40, &entries),
    ]
    .concat();
    msg(cmd::RES_MR_GET, 2, seq, &body)
}

fn raw_state(s: QpState) -> u8 {
    match s {
        QpState::Reset => 0,
        QpState::Init => 1,
        QpState::Rtr => 2,
        QpState::Rts => 3,
        QpState::Sqd => 4,
        QpState::Sqe => 5,
        QpState::Err => 6,
        QpState::Unknown(v) => v,
    }
}

fn raw_type(t: QpType) -> u8 {
    match t {
        QpType::Smi => 0,
        QpType::Gsi => 1,
        QpType::Rc => 2,
        QpType::Uc => 3,
        QpType::Ud => 4,
        QpType::RawIpv6 => 5,
        QpType::RawEthertype => 6,
        QpType::RawPacket => 8,
        QpType::XrcIni => 9,
        QpType::XrcTgt => 10,
        QpType::Driver => 0xff,
        QpType::Unknown(v) => v,
    }
}

fn name() -> impl Strategy<Value = String> {
    "[a-z][a-z0-9_]{0,20}"
}

fn owner() -> impl Strategy<Value = (Option<u32>, Option<String>)> {
    prop_oneof![
        (1u32..u32::MAX).prop_map(|p| (Some(p), None)),
        name().prop_map(|k| (None, Some(k))),
        Just((None, None)),
    ]
}

fn qp_entry(dev_index: u32, dev_name: String) -> impl Strategy<Value = QpEntry> {
    (
        proptest::option::of(1u32..4),
        any::<u32>(),
        any::<u8>(),
        any::<u8>(),
        owner(),
    )
        .prop_map(move |(port, lqpn, st, ty, (pid, kern_name))| QpEntry {
            dev_index,
            dev_name: dev_name.clone(),
            port,
            lqpn,
            state: QpState::from_raw(st),
            qp_type: QpType::from_raw(ty),
            pid,
            kern_name,
        })
}

fn mr_entry(dev_index: u32, dev_name: String) -> impl Strategy<Value = MrEntry> {
    (
        proptest::option::of(any::<u32>()),
        any::<u64>(),
        proptest::option::of(any::<u32>()),
        owner(),
    )
        .prop_map(move |(mrn, mr_len, pdn, (pid, kern_name))| MrEntry {
            dev_index,
            dev_name: dev_name.clone(),
            mrn,
            mr_len,
            pdn,
            pid,
            kern_name,
        })
}

/// A valid datagram: two QP messages and NLMSG_DONE, sequence 7.
fn valid_qp_datagram() -> Vec<u8> {
    let q = |lqpn, pid| QpEntry {
        dev_index: 3,
        dev_name: "rxe0".into(),
        port: Some(1),
        lqpn,
        state: QpState::Rts,
        qp_type: QpType::Rc,
        pid,
        kern_name: None,
    };
    let mut b = qp_message(7, 3, "rxe0", &[q(17, Some(100)), q(18, Some(101))]);
    b.extend(qp_message(7, 3, "rxe0", &[q(19, None)]));
    b.extend(done(7));
    b
}

/// Every parser over the bytes: never a panic, results bounded by the input.
fn check_all(bytes: &[u8]) {
    let bound = bytes.len() / 4 + 1;
    let str_ok = |x: &str| x.len() <= 3 * MAX_NAME;
    if let Ok(p) = parse_answer(bytes, 7, cmd::RES_QP_GET, nldev::parse_qps) {
        assert!(p.items.len() <= bound);
        for q in &p.items {
            assert!(str_ok(&q.dev_name) && q.kern_name.as_deref().is_none_or(str_ok));
        }
    }
    if let Ok(p) = parse_answer(bytes, 7, cmd::RES_MR_GET, nldev::parse_mrs) {
        assert!(p.items.len() <= bound);
    }
    if let Ok(p) = parse_answer(bytes, 7, cmd::RES_CQ_GET, nldev::parse_cqs) {
        assert!(p.items.len() <= bound);
    }
    if let Ok(p) = parse_answer(bytes, 7, cmd::RES_PD_GET, nldev::parse_pds) {
        assert!(p.items.len() <= bound);
    }
    if let Ok(p) = parse_answer(bytes, 7, cmd::STAT_GET, |b| {
        nldev::parse_port_counters(b).map(|c| vec![c])
    }) {
        for c in &p.items {
            assert!(c.counters.len() <= bound);
            assert!(c.counters.keys().all(|k| str_ok(k)));
        }
    }
    let _ = parse_answer(bytes, 7, cmd::GET, |b| {
        nldev::parse_device(b).map(|d| vec![d])
    });
    let _ = parse_answer(bytes, 7, cmd::RES_GET, |b| {
        nldev::parse_res_summary(b).map(|d| vec![d])
    });
    // The raw iterators, over the bytes as a datagram and as an attribute block.
    assert!(nldev::messages(bytes).count() <= bound);
    assert!(nldev::attrs(bytes).count() <= bound);
    for m in nldev::messages(bytes).flatten() {
        let _ = nldev::classify(m);
        let _ = nldev::parse_qps(m.payload);
        let _ = nldev::parse_port_counters(m.payload);
    }
    let _ = nldev::parse_qps(bytes);
    let _ = nldev::parse_mrs(bytes);
    let _ = nldev::parse_cqs(bytes);
    let _ = nldev::parse_pds(bytes);
}

proptest! {
    #[test]
    fn arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        check_all(&bytes);
    }

    #[test]
    fn mutated_valid_answers(
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
        do_cut in any::<bool>(),
        splice in proptest::collection::vec(any::<u8>(), 0..32),
        at in any::<prop::sample::Index>(),
    ) {
        let mut b = valid_qp_datagram();
        for (i, v) in &flips {
            let i = i.index(b.len());
            b[i] = *v;
        }
        if do_cut {
            b.truncate(cut.index(b.len() + 1));
        }
        check_all(&b);
        let mut c = valid_qp_datagram();
        let at = at.index(c.len() + 1);
        c.splice(at..at, splice);
        check_all(&c);
    }

    #[test]
    fn generated_qp_answers_parse_back(
        qps in (0u32..8, name()).prop_flat_map(|(i, n)| proptest::collection::vec(qp_entry(i, n.clone()), 0..12)),
        split in any::<prop::sample::Index>(),
    ) {
        let (dev_index, dev_name) = qps.first().map(|q| (q.dev_index, q.dev_name.clone())).unwrap_or((0, "x".into()));
        // The kernel splits a big table over several messages: split it anywhere.
        let k = split.index(qps.len() + 1);
        let mut b = qp_message(7, dev_index, &dev_name, &qps[..k]);
        b.extend(qp_message(7, dev_index, &dev_name, &qps[k..]));
        b.extend(done(7));
        let p = parse_answer(&b, 7, cmd::RES_QP_GET, nldev::parse_qps).unwrap();
        prop_assert!(p.done);
        prop_assert_eq!(p.items, qps);
    }

    #[test]
    fn generated_mr_answers_parse_back(
        mrs in (0u32..8, name()).prop_flat_map(|(i, n)| proptest::collection::vec(mr_entry(i, n.clone()), 0..12)),
    ) {
        let (dev_index, dev_name) = mrs.first().map(|q| (q.dev_index, q.dev_name.clone())).unwrap_or((0, "x".into()));
        let mut b = mr_message(7, dev_index, &dev_name, &mrs);
        b.extend(done(7));
        let p = parse_answer(&b, 7, cmd::RES_MR_GET, nldev::parse_mrs).unwrap();
        prop_assert!(p.done);
        prop_assert_eq!(p.items, mrs);
    }

    #[test]
    fn a_kernel_errno_is_reported_positive(errno in 1i32..4096) {
        let mut b = done(7);
        b[16..20].copy_from_slice(&(-errno).to_ne_bytes());
        prop_assert_eq!(
            parse_answer(&b, 7, cmd::RES_QP_GET, nldev::parse_qps),
            Err(AnswerError::Errno(errno))
        );
    }
}
