//! A lane the peer refuses for want of room (`RESOURCE_EXHAUSTED`: its limit on a link's lanes)
//! leaves the link as it was: the caller waits for one of the lanes it has, and the link still
//! moves data.

use std::time::{Duration, Instant};

use crate::error::Error;
use crate::testkit::Rng;
use crate::types::TransferOp;
use crate::{Hixl, Options, SameHost, TransferDesc};

const LEN: usize = 64 << 10;

#[test]
fn a_lane_refused_for_want_of_room_keeps_the_link() {
    let tcp = || Options::default().same_host(SameHost::Forbid);
    let srv = Hixl::initialize_ephemeral("127.0.0.1", tcp().max_server_lanes_per_link(2))
        .unwrap()
        .into_registered();
    let _served = srv.register(vec![0u8; LEN]).unwrap();
    let srv = srv.activate().unwrap();
    let cli = Hixl::initialize_ephemeral("127.0.0.1", tcp().max_lanes(4))
        .unwrap()
        .into_registered();
    let mut buf = cli.register(vec![0u8; 2 * LEN]).unwrap();
    let cli = cli.activate().unwrap();
    let link = cli.connect(srv.name()).unwrap();
    let lanes = link.shared.lanes_for_test();
    let long = || {
        let now = Instant::now();
        (now + Duration::from_secs(20), now)
    };
    // the link's first lane, and a second that joins it: the server's two
    let (d, t) = long();
    let first = lanes.checkout(d, t, "a test").unwrap();
    let (d, t) = long();
    let second = lanes.checkout(d, t, "a test").unwrap();
    // a third is refused for want of room: the caller waits for one of the two, until its
    // deadline; the link is not broken
    let t = Instant::now();
    let e = lanes
        .checkout(t + Duration::from_millis(300), t, "a test")
        .unwrap_err();
    assert!(
        matches!(e, Error::LanesExhausted { lanes: 2, .. }),
        "a lane the server had no room for: {e:?}"
    );
    assert!(
        !lanes.is_broken(),
        "the link broke for a lane refused for want of room"
    );
    // a lane given back is the next caller's
    lanes.checkin(first);
    let (d, t) = long();
    let again = lanes.checkout(d, t, "a test").unwrap();
    lanes.checkin(again);
    lanes.checkin(second);
    // and the link moves data both ways
    let data = Rng::new(44).bytes(LEN);
    buf.write_at(0, &data).unwrap();
    let r = link.regions().next().unwrap();
    let out = [TransferDesc::new(
        buf.range(0..LEN).unwrap(),
        r.range(0..LEN as u64).unwrap(),
    )];
    link.transfer_sync(TransferOp::Write, &out, Duration::from_secs(20))
        .unwrap();
    let back = [TransferDesc::new(
        buf.range(LEN..2 * LEN).unwrap(),
        r.range(0..LEN as u64).unwrap(),
    )];
    link.transfer_sync(TransferOp::Read, &back, Duration::from_secs(20))
        .unwrap();
    let mut got = vec![0u8; LEN];
    buf.read_at(LEN, &mut got).unwrap();
    assert!(
        got == data,
        "the READ brought back other bytes than the WRITE sent"
    );
}
