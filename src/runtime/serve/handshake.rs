//! A connection's handshake as a state machine that owns no socket and no lock: the poller
//! reads each whole frame, hands it to [`Handshake::on_frame`] with what the server checks it
//! against ([`Admission`]), and does what the [`Step`] says: send a frame and wait for the
//! next, run the same-host proof, hand the connection to a worker, or refuse it. HELLO, then
//! CHALLENGE/AUTH with a pre-shared key, then PROVE/PROOF for a client that says it runs on
//! this host. A handshake that completes is counted as established by the poller and opened
//! (or joined to its link) by a worker.
//!
//! Same-host proof: a HELLO that names a process on this host gets a fence (a memfd) and that
//! process pinned (a pidfd) only once the client proved it is that process: the server sends a
//! random nonce (PROVE), the client puts it in a write-sealed memfd of its own and answers with
//! the descriptor's number (PROOF), and the server takes that descriptor from the process it
//! pins (`pidfd_getfd`, which only works on a process the server may trace), checks the seals
//! and reads the nonce ([`Step::Prove`]: the driver's part). A client that cannot prove it (or
//! a server whose fence budget is spent) is served over TCP. With a key, the proof comes after
//! authentication: nothing is spent on a client that did not prove the key.
//!
//! Public (hidden) for the fuzz target over whole frame sequences (`fuzz/src/bodies.rs`).

use std::net::SocketAddr;
use std::time::Instant;

use super::limits::{self, Progress};
use crate::auth::{Psk, Role};
use crate::error::Status;
use crate::types::HostId;
use crate::wire::{self, Hello, Kind, LaneRole, Refuse, WireError};

/// What a handshake is checked against: the server's settings, and this connection's two
/// addresses, as the driver sees them when a frame comes in.
#[derive(Debug, Clone, Copy)]
pub struct Admission<'a> {
    /// The key clients must prove (`None`: no authentication).
    pub psk: Option<&'a Psk>,
    /// The client engine names served (`None`: all).
    pub allow: Option<&'a [String]>,
    /// This process, offered to same-host clients (`None`: same-host transfers are off).
    pub host: Option<HostId>,
    /// A fence may be handed out now (serving has not stopped, the budget has room).
    pub fence_room: bool,
    /// The client's address.
    pub client: SocketAddr,
    /// The server's end of the connection (what a keyed HELLO's nonce vouches for; `None` when
    /// unknown or no key is set).
    pub server: Option<SocketAddr>,
}

impl Admission<'_> {
    /// Whether `hello` names a process on this server's host (boot id and pid namespace).
    pub fn same_host(&self, hello: &Hello) -> bool {
        matches!((&hello.host, &self.host), (Some(c), Some(s)) if c.same_host(s))
    }
}

/// Where a handshake is.
#[derive(Debug)]
enum Stage {
    /// Waiting for the HELLO.
    Hello,
    /// CHALLENGE sent with the server's nonce `sn`; waiting for the AUTH.
    Auth { hello: Box<Hello>, sn: [u8; 32] },
    /// PROVE sent with `nonce`; waiting for the PROOF (the client's descriptor holding it).
    Prove { hello: Box<Hello>, nonce: [u8; 32] },
}

/// A handshake in progress: its stage and its deadline, nothing of the connection.
#[derive(Debug)]
pub struct Handshake {
    stage: Stage,
    /// The whole handshake's deadline.
    pub deadline: Instant,
    /// When it began (the oldest of equals makes room first).
    pub since: Instant,
    /// Its HELLO's nonce vouched for the key ([`Psk::vouches`]): never cut for a newcomer.
    vouched: bool,
}

/// Why a handshake ends without a link: what the client is told, and what the log says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The REFUSE's status.
    pub status: Status,
    /// The REFUSE's reason.
    pub told: String,
    /// What the server's log says.
    pub why: String,
}

impl Refusal {
    /// Refuses with `status`, telling the client `told`; the log says `why`.
    pub fn new(status: Status, told: impl Into<String>, why: impl Into<String>) -> Self {
        Self {
            status,
            told: told.into(),
            why: why.into(),
        }
    }

    /// Input that breaks the protocol (a frame that does not decode, of a kind the stage does
    /// not expect, or with a malformed payload): [`limits::PROTOCOL_VIOLATION`] at every
    /// stage, as on an established lane.
    pub fn violation(e: &WireError) -> Self {
        Self::new(
            limits::PROTOCOL_VIOLATION,
            e.to_string(),
            "protocol violation",
        )
    }

    /// The REFUSE frame that tells the client.
    pub fn frame(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + self.told.len());
        Refuse {
            status: self.status.code(),
            reason: self.told.clone(),
        }
        .encode(&mut out);
        out
    }
}

/// What a frame came to.
#[derive(Debug)]
pub enum Step {
    /// Send this frame (CHALLENGE or PROVE) and wait for the client's answer.
    Send(Vec<u8>, Box<Handshake>),
    /// The client says the process `hello.host` holds `nonce` in its descriptor `fd`: the
    /// driver checks it (`pidfd_getfd`), then the handshake is complete, with the fence the
    /// client earned or none (it is then served over TCP).
    Prove {
        /// Its HELLO.
        hello: Box<Hello>,
        /// The descriptor number the client named.
        fd: u64,
        /// The nonce sent in the PROVE.
        nonce: [u8; 32],
    },
    /// Complete without a same-host proof: authenticated and allowed.
    Done(Box<Hello>),
    /// Ended: the connection closes (after the REFUSE, if its socket takes it).
    Refuse(Refusal),
}

impl Handshake {
    /// A handshake that began at `now` and must be complete by `deadline`.
    pub fn new(now: Instant, deadline: Instant) -> Self {
        Self {
            stage: Stage::Hello,
            deadline,
            since: now,
            vouched: false,
        }
    }

    /// How far it got (what decides which handshake makes room for a newcomer).
    pub(crate) fn progress(&self, keyed: bool) -> Progress {
        if self.vouched {
            return Progress::Authenticated;
        }
        match self.stage {
            Stage::Hello => Progress::Silent,
            Stage::Auth { .. } => Progress::Greeted,
            Stage::Prove { .. } if keyed => Progress::Authenticated,
            Stage::Prove { .. } => Progress::Greeted,
        }
    }

    /// Takes the client's next whole frame (`kind`, `payload`) and says what follows.
    pub fn on_frame(mut self: Box<Self>, kind: Kind, payload: &[u8], adm: &Admission) -> Step {
        match std::mem::replace(&mut self.stage, Stage::Hello) {
            Stage::Hello => {
                if kind != Kind::Hello {
                    return violation(WireError::Unexpected(kind));
                }
                let hello = match Hello::decode(payload) {
                    Ok(h) => Box::new(h),
                    Err(e) => return violation(e),
                };
                let Some(key) = adm.psk else {
                    return self.authenticated(hello, adm);
                };
                // the address the client dialed must be this end's: a keyless relay at another
                // address that forwards the HELLO is refused here, and one that rewrites the
                // target gets a proof over this target, which the client does not accept
                if !adm
                    .server
                    .is_some_and(|s| crate::auth::names(&hello.target, s))
                {
                    let why = format!(
                        "engine {:?} dialed {:?}, not this server's address {}",
                        hello.name,
                        hello.target,
                        adm.server.map_or("(unknown)".into(), |s| s.to_string())
                    );
                    return Step::Refuse(Refusal::new(
                        Status::PARAM_INVALID,
                        "authentication failed: the address dialed is not this server's",
                        why,
                    ));
                }
                let Ok(sn) = crate::auth::nonce() else {
                    return no_randomness();
                };
                self.vouched = adm
                    .server
                    .is_some_and(|s| key.vouches(&hello.nonce, &hello.name, adm.client, s));
                let proof = key.server_proof(&hello.nonce, &sn, who(&hello));
                let mut out = Vec::with_capacity(96);
                wire::encode_auth(&mut out, Kind::Challenge, &[&sn, &proof]);
                self.stage = Stage::Auth { hello, sn };
                Step::Send(out, self)
            }
            Stage::Auth { hello, sn } => {
                // a frame that is not a well-formed AUTH breaks the protocol, as at any other
                // stage; a well-formed one with the wrong proof fails authentication
                let answer = match (kind, wire::decode_auth(payload, 1)) {
                    (Kind::Auth, Ok(f)) => f[0],
                    (Kind::Auth, Err(e)) => return violation(e),
                    (k, _) => return violation(WireError::Unexpected(k)),
                };
                let Some(key) = adm.psk else {
                    // the key went between the frames (it cannot): nothing to check against
                    return Step::Refuse(Refusal::new(
                        Status::PARAM_INVALID,
                        "authentication failed",
                        "no key to check an AUTH against",
                    ));
                };
                if !key.check(Role::Client, &hello.nonce, &sn, who(&hello), &answer) {
                    let why = format!("engine {:?} failed authentication", hello.name);
                    return Step::Refuse(Refusal::new(
                        Status::PARAM_INVALID,
                        "authentication failed",
                        why,
                    ));
                }
                self.authenticated(hello, adm)
            }
            Stage::Prove { hello, nonce } => match (kind, wire::decode_proof(payload)) {
                (Kind::Proof, Ok(fd)) => Step::Prove { hello, fd, nonce },
                (Kind::Proof, Err(e)) => violation(e),
                (k, _) => violation(WireError::Unexpected(k)),
            },
        }
    }

    /// The client is authenticated (or no key is needed): the allow-list, then the same-host
    /// proof for a new link from a process on this host, else the end of the handshake.
    fn authenticated(mut self: Box<Self>, hello: Box<Hello>, adm: &Admission) -> Step {
        if let Some(allow) = adm.allow
            && !allow.contains(&hello.name)
        {
            let why = format!("engine {:?} is not on the allow-list", hello.name);
            return Step::Refuse(Refusal::new(Status::PARAM_INVALID, why.clone(), why));
        }
        if hello.role == LaneRole::NewLink && adm.same_host(&hello) && adm.fence_room {
            let Ok(nonce) = crate::auth::nonce() else {
                return no_randomness();
            };
            let mut out = Vec::with_capacity(48);
            wire::encode_prove(&mut out, &nonce);
            self.stage = Stage::Prove { hello, nonce };
            return Step::Send(out, self);
        }
        Step::Done(hello)
    }
}

/// What `hello` says of the two ends, as the proofs bind it.
fn who(hello: &Hello) -> crate::auth::Who<'_> {
    crate::auth::Who {
        name: &hello.name,
        target: &hello.target,
    }
}

/// Ends a handshake that broke the protocol.
fn violation(e: WireError) -> Step {
    Step::Refuse(Refusal::violation(&e))
}

/// The random source failed: the client is refused, never given a guessable nonce.
fn no_randomness() -> Step {
    let told = "the server has no random source";
    Step::Refuse(Refusal::new(Status::FAILED, told, told))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const CLIENT: &str = "10.0.0.7:4000";
    const SERVER: &str = "10.0.0.1:5000";

    fn host(boot: u8, pid: u32) -> HostId {
        HostId {
            boot: [boot; 16],
            pidns: 4026531836,
            pid,
            start: 99,
        }
    }

    fn hello(name: &str, role: LaneRole, host: Option<HostId>) -> Hello {
        Hello {
            role,
            instance: 7,
            token: 0,
            name: name.into(),
            target: SERVER.into(),
            host,
            nonce: [5; 32],
        }
    }

    /// The payload of an encoded frame, and its kind.
    fn split(frame: &[u8]) -> (Kind, Vec<u8>) {
        let h: [u8; wire::HEADER_LEN] = frame[..wire::HEADER_LEN].try_into().unwrap();
        let h = wire::decode_header(&h).unwrap();
        assert_eq!(h.len as usize, frame.len() - wire::HEADER_LEN);
        (h.kind, frame[wire::HEADER_LEN..].to_vec())
    }

    fn hello_frame(h: &Hello) -> (Kind, Vec<u8>) {
        let mut out = Vec::new();
        h.encode(&mut out);
        split(&out)
    }

    fn adm<'a>(psk: Option<&'a Psk>, allow: Option<&'a [String]>, room: bool) -> Admission<'a> {
        Admission {
            psk,
            allow,
            host: Some(host(1, 100)),
            fence_room: room,
            client: CLIENT.parse().unwrap(),
            server: Some(SERVER.parse().unwrap()),
        }
    }

    fn start() -> Box<Handshake> {
        let now = Instant::now();
        Box::new(Handshake::new(now, now + Duration::from_secs(5)))
    }

    fn feed(hs: Box<Handshake>, (kind, p): &(Kind, Vec<u8>), a: &Admission) -> Step {
        hs.on_frame(*kind, p, a)
    }

    /// What a step sent and the handshake that waits for the answer (panics on any other step).
    fn sent(step: Step, want: Kind) -> (Vec<u8>, Box<Handshake>) {
        match step {
            Step::Send(f, hs) => {
                let (k, p) = split(&f);
                assert_eq!(k, want, "sent {k:?}, not {want:?}");
                (p, hs)
            }
            other => panic!("expected a {want:?} to send, got {other:?}"),
        }
    }

    fn refused(step: Step) -> Refusal {
        match step {
            Step::Refuse(r) => {
                // what the client is told decodes as a REFUSE with the same status and reason
                let (k, p) = split(&r.frame());
                assert_eq!(k, Kind::Refuse);
                let told = Refuse::decode(&p).unwrap();
                assert_eq!((told.status, &told.reason), (r.status.code(), &r.told));
                r
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    fn done(step: Step) -> Box<Hello> {
        match step {
            Step::Done(h) => h,
            other => panic!("expected the handshake to complete, got {other:?}"),
        }
    }

    /// The CHALLENGE's server nonce, once its proof checked out with `key`.
    fn challenge(p: &[u8], key: &Psk, h: &Hello) -> [u8; 32] {
        let f = wire::decode_auth(p, 2).unwrap();
        assert!(
            key.check(Role::Server, &h.nonce, &f[0], who(h), &f[1]),
            "the server's proof"
        );
        f[0]
    }

    fn auth_frame(key: &Psk, h: &Hello, sn: &[u8; 32]) -> (Kind, Vec<u8>) {
        let mut out = Vec::new();
        let proof = key.client_proof(&h.nonce, sn, who(h));
        wire::encode_auth(&mut out, Kind::Auth, &[&proof]);
        split(&out)
    }

    fn proof_frame(fd: u64) -> (Kind, Vec<u8>) {
        let mut out = Vec::new();
        wire::encode_proof(&mut out, fd);
        split(&out)
    }

    #[test]
    fn a_hello_without_a_key_completes_at_once() {
        let a = adm(None, None, true);
        let h = hello("10.0.0.7", LaneRole::NewLink, None);
        let hs = start();
        assert_eq!(hs.progress(false), Progress::Silent);
        assert_eq!(*done(feed(hs, &hello_frame(&h), &a)), h);
        // a lane joining a link, from this host: no proof for a join
        let j = Hello {
            token: 9,
            ..hello("10.0.0.7", LaneRole::Join, Some(host(1, 200)))
        };
        assert_eq!(*done(feed(start(), &hello_frame(&j), &a)), j);
    }

    #[test]
    fn with_a_key_the_challenge_and_the_right_auth_complete() {
        let key = Psk::new("the key");
        let a = adm(Some(&key), None, true);
        let h = hello("10.0.0.7", LaneRole::NewLink, None);
        let (p, hs) = sent(feed(start(), &hello_frame(&h), &a), Kind::Challenge);
        assert_eq!(hs.progress(true), Progress::Greeted);
        let sn = challenge(&p, &key, &h);
        assert_eq!(*done(feed(hs, &auth_frame(&key, &h, &sn), &a)), h);
    }

    #[test]
    fn a_wrong_auth_fails_authentication() {
        let key = Psk::new("the key");
        let a = adm(Some(&key), None, true);
        let h = hello("10.0.0.7", LaneRole::NewLink, None);
        let (p, hs) = sent(feed(start(), &hello_frame(&h), &a), Kind::Challenge);
        let sn = challenge(&p, &key, &h);
        // proved with another key, and with the right key over another server nonce
        let r = refused(feed(hs, &auth_frame(&Psk::new("not it"), &h, &sn), &a));
        assert_eq!(
            (r.status, r.told.as_str()),
            (Status::PARAM_INVALID, "authentication failed")
        );
        let (_, hs) = sent(feed(start(), &hello_frame(&h), &a), Kind::Challenge);
        let r = refused(feed(hs, &auth_frame(&key, &h, &[0; 32]), &a));
        assert_eq!(r.status, Status::PARAM_INVALID);
    }

    #[test]
    fn a_hello_whose_nonce_vouches_for_the_key_is_authenticated_early() {
        let key = Psk::new("the key");
        let a = adm(Some(&key), None, true);
        let (c, s) = (CLIENT.parse().unwrap(), SERVER.parse().unwrap());
        let h = Hello {
            nonce: key.vouching_nonce("10.0.0.7", c, s).unwrap(),
            ..hello("10.0.0.7", LaneRole::NewLink, None)
        };
        let (_, hs) = sent(feed(start(), &hello_frame(&h), &a), Kind::Challenge);
        assert_eq!(hs.progress(true), Progress::Authenticated);
        // vouching for another connection's addresses counts for nothing
        let other = Admission {
            server: Some("10.0.0.2:5000".parse().unwrap()),
            ..a
        };
        let to_other = Hello {
            target: "10.0.0.2:5000".into(),
            ..h.clone()
        };
        let (_, hs) = sent(
            feed(start(), &hello_frame(&to_other), &other),
            Kind::Challenge,
        );
        assert_eq!(hs.progress(true), Progress::Greeted);
    }

    /// With a key, a HELLO whose target is not the address this end of the connection has (a
    /// relay at another address forwarding a client's HELLO) is refused before the server
    /// proves anything; the proofs bind the target, so rewriting it does not help a relay.
    #[test]
    fn a_keyed_hello_that_dialed_another_address_is_refused() {
        let key = Psk::new("the key");
        let a = adm(Some(&key), None, true);
        for target in ["10.0.0.9:5000", "10.0.0.1:5001", "", "10.0.0.1"] {
            let h = Hello {
                target: target.into(),
                ..hello("10.0.0.7", LaneRole::NewLink, None)
            };
            let r = refused(feed(start(), &hello_frame(&h), &a));
            assert_eq!(r.status, Status::PARAM_INVALID, "{target:?}");
            assert!(r.told.contains("not this server's"), "{}", r.told);
        }
        // without a key nothing is proven, and the target is not checked
        let open = adm(None, None, true);
        let h = Hello {
            target: String::new(),
            ..hello("10.0.0.7", LaneRole::NewLink, None)
        };
        assert_eq!(*done(feed(start(), &hello_frame(&h), &open)), h);
    }

    #[test]
    fn the_allow_list_refuses_other_names_after_authentication() {
        let allow = vec!["10.0.0.7".to_owned()];
        let a = adm(None, Some(&allow), true);
        let ok = hello("10.0.0.7", LaneRole::NewLink, None);
        assert_eq!(*done(feed(start(), &hello_frame(&ok), &a)), ok);
        let stranger = hello("10.0.0.8", LaneRole::NewLink, None);
        let r = refused(feed(start(), &hello_frame(&stranger), &a));
        assert_eq!(r.status, Status::PARAM_INVALID);
        assert!(r.told.contains("not on the allow-list"), "{}", r.told);
        // with a key: challenged first, refused once authenticated (a name is not checked
        // before the client proved it has the key)
        let key = Psk::new("the key");
        let a = adm(Some(&key), Some(&allow), true);
        let (p, hs) = sent(feed(start(), &hello_frame(&stranger), &a), Kind::Challenge);
        let sn = challenge(&p, &key, &stranger);
        let r = refused(feed(hs, &auth_frame(&key, &stranger, &sn), &a));
        assert!(r.told.contains("not on the allow-list"), "{}", r.told);
    }

    #[test]
    fn a_same_host_client_is_asked_to_prove_itself() {
        let a = adm(None, None, true);
        let h = hello("10.0.0.7", LaneRole::NewLink, Some(host(1, 200)));
        let (p, hs) = sent(feed(start(), &hello_frame(&h), &a), Kind::Prove);
        assert_eq!(hs.progress(false), Progress::Greeted);
        let nonce: [u8; 32] = p.as_slice().try_into().expect("a PROVE holds the nonce");
        match feed(hs, &proof_frame(12), &a) {
            Step::Prove {
                hello,
                fd,
                nonce: n,
            } => {
                assert_eq!((*hello, fd, n), (h.clone(), 12, nonce));
            }
            other => panic!("expected the proof to be checked, got {other:?}"),
        }
        // no fence room, another host, or same-host transfers off: served over TCP at once
        let full = adm(None, None, false);
        assert_eq!(*done(feed(start(), &hello_frame(&h), &full)), h);
        let elsewhere = hello("10.0.0.7", LaneRole::NewLink, Some(host(2, 200)));
        assert_eq!(
            *done(feed(start(), &hello_frame(&elsewhere), &a)),
            elsewhere
        );
        let off = Admission { host: None, ..a };
        assert_eq!(*done(feed(start(), &hello_frame(&h), &off)), h);
    }

    #[test]
    fn with_a_key_the_proof_comes_after_authentication() {
        let key = Psk::new("the key");
        let a = adm(Some(&key), None, true);
        let h = hello("10.0.0.7", LaneRole::NewLink, Some(host(1, 200)));
        let (p, hs) = sent(feed(start(), &hello_frame(&h), &a), Kind::Challenge);
        let sn = challenge(&p, &key, &h);
        let (_, hs) = sent(feed(hs, &auth_frame(&key, &h, &sn), &a), Kind::Prove);
        assert_eq!(hs.progress(true), Progress::Authenticated);
        assert!(matches!(
            feed(hs, &proof_frame(3), &a),
            Step::Prove { fd: 3, .. }
        ));
    }

    /// Every frame out of its place, and every malformed payload, is refused with the one
    /// status of a protocol violation, at every stage (as `tests/serving/hostile.rs` expects on the
    /// wire).
    #[test]
    fn one_status_for_what_breaks_the_protocol_at_every_stage() {
        let key = Psk::new("the key");
        let plain = adm(None, None, true);
        let keyed = adm(Some(&key), None, true);
        let h = hello("10.0.0.7", LaneRole::NewLink, Some(host(1, 200)));
        let ping = (Kind::Ping, Vec::new());
        let junk = |k: Kind| (k, vec![0xFF; 3]);
        // at the HELLO: an AUTH before any CHALLENGE, a PROOF before any PROVE, a request, a
        // malformed HELLO
        let at_hello = [
            auth_frame(&key, &h, &[0; 32]),
            proof_frame(3),
            ping.clone(),
            junk(Kind::Hello),
        ];
        for f in &at_hello {
            for a in [&plain, &keyed] {
                let r = refused(feed(start(), f, a));
                assert_eq!(
                    r.status,
                    limits::PROTOCOL_VIOLATION,
                    "{:?} first: {r:?}",
                    f.0
                );
            }
        }
        // at the AUTH: a second HELLO, a PROOF, a request, a malformed AUTH
        let at_auth = [
            hello_frame(&h),
            proof_frame(3),
            ping.clone(),
            junk(Kind::Auth),
        ];
        for f in &at_auth {
            let (_, hs) = sent(feed(start(), &hello_frame(&h), &keyed), Kind::Challenge);
            let r = refused(feed(hs, f, &keyed));
            assert_eq!(
                r.status,
                limits::PROTOCOL_VIOLATION,
                "{:?} for the AUTH",
                f.0
            );
        }
        // at the PROOF: a second HELLO, an AUTH, a request, a malformed PROOF
        let at_proof = [
            hello_frame(&h),
            auth_frame(&key, &h, &[0; 32]),
            ping,
            junk(Kind::Proof),
        ];
        for f in &at_proof {
            let (_, hs) = sent(feed(start(), &hello_frame(&h), &plain), Kind::Prove);
            let r = refused(feed(hs, f, &plain));
            assert_eq!(
                r.status,
                limits::PROTOCOL_VIOLATION,
                "{:?} for the PROOF",
                f.0
            );
        }
    }
}
