//! LLM-DataDist's link notes are bound to their sender (issue #42, item 2): a cluster that
//! linked here is reached back at the address its own engine announced, and no other engine
//! can move that, claim its id, or unlink it. The honest decoder runs in another process
//! (`hixl-peer datadist-serve`); the prompt, an impostor cluster claiming the decoder's id and
//! a plain engine forging notes run in this one. Every push is checked against the bytes the
//! decoder's process holds.

use crate::common;
use crate::serve_child::Peer;

use common::{Rng, fnv1a};
use hixl::compat::{self, NotifyDesc};
use hixl::datadist::{
    CacheDesc, CacheKey, CacheKind, ClusterInfo, DataDist, DataType, Layers, LlmStatus, Placement,
    RemoteCache, Role,
};

const DECODER: u64 = 7;
const MODEL: u64 = 9;
const TENSORS: u32 = 2;
const BLOCKS: u64 = 16;
const BLOCK: u64 = 4096;

/// A cluster of this process listening on an ephemeral port, with pulls and pushes of 10 s.
fn listening(cluster: u64, role: Role) -> DataDist {
    listening_with(cluster, role, &[])
}

/// [`listening`], with more options.
fn listening_with(cluster: u64, role: Role, more: &[(&str, &str)]) -> DataDist {
    let dd = DataDist::new(cluster, role);
    let mut opts = vec![
        ("llm.ListenIpInfo".to_owned(), "127.0.0.1:0".to_owned()),
        ("llm.SyncKvCacheWaitTime".to_owned(), "10000".to_owned()),
    ];
    opts.extend(more.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    dd.initialize(&opts).unwrap();
    dd
}

/// Registers `mem` (one `Vec` a tensor) as a blocks cache under model `model`.
fn register(dd: &DataDist, mem: &mut [Vec<u8>], model: u64) -> i64 {
    let desc = CacheDesc {
        placement: Placement::Host,
        num_tensors: mem.len() as u32,
        data_type: DataType::FLOAT16,
        shape: vec![BLOCKS as i64, (BLOCK / 2) as i64],
    };
    let addrs: Vec<u64> = mem.iter_mut().map(|m| m.as_mut_ptr() as u64).collect();
    let key = CacheKey {
        req_id: u64::MAX,
        model_id: model,
    };
    // SAFETY: each test keeps the tensors alive and unmoved until the instance is finalized,
    // and reads them only after the transfers touching them returned.
    unsafe { dd.register_cache(&desc, &addrs, CacheKind::Blocks, 0, &[key]) }.unwrap()
}

#[test]
fn forged_link_notes_do_not_redirect_a_push_from_the_decoder_that_linked() {
    const ROUNDS: u64 = 5;
    let len = (BLOCKS * BLOCK) as usize;
    let mut rng = Rng::new(42);
    // rounds whose pushes reached the impostor, failed, or left the decoder without its bytes
    let (mut redirected, mut failed, mut missing) = (0, 0, 0);
    for round in 0..ROUNDS {
        // the honest decoder, in its own process; what its tensors hold (its seeds), kept up
        // to date with the pushes
        let seed = 50 + 10 * round;
        let mut decoder = Peer::spawn(DECODER, TENSORS, BLOCKS, BLOCK, seed, MODEL);
        let mut theirs: Vec<Vec<u8>> = (0..TENSORS as u64)
            .map(|t| Rng::new(seed + t).bytes(len))
            .collect();
        // the prompt, a new cluster each round, that the decoder links to
        let prompt_id = 100 + round;
        let prompt = listening(prompt_id, Role::Prompt);
        let paddr = prompt.listen_addr().unwrap();
        let mut pk: Vec<Vec<u8>> = (0..TENSORS).map(|_| rng.bytes(len)).collect();
        let pid = register(&prompt, &mut pk, 0);
        assert_eq!(decoder.link(prompt_id, paddr), LlmStatus::LLM_SUCCESS);

        // an impostor: a cluster of this process claiming the decoder's id, with a cache like
        // the decoder's, links to the prompt too (its note names its own engine, truthfully)
        let impostor = listening(DECODER, Role::Decoder);
        let mut ik: Vec<Vec<u8>> = (0..TENSORS).map(|_| vec![0u8; len]).collect();
        register(&impostor, &mut ik, MODEL);
        let (ret, _) = impostor
            .link_clusters(&[ClusterInfo::at(prompt_id, paddr)], 10_000)
            .unwrap();
        assert_eq!(ret, LlmStatus::LLM_SUCCESS);
        // and a plain engine says the decoder unlinked, then names the impostor's address
        let forger = compat::Hixl::new();
        forger
            .initialize("127.0.0.1", [("AutoConnect", "0")])
            .unwrap();
        let premote = paddr.to_string();
        forger.connect(&premote, 10_000).unwrap();
        let iaddr = impostor.listen_addr().unwrap();
        let forge = |name: &str, msg: String| {
            let note = NotifyDesc {
                name: name.into(),
                notify_msg: msg,
            };
            forger.send_notify(&premote, &note, 10_000).unwrap();
        };
        forge("hixl.datadist.unlink", DECODER.to_string());
        forge("hixl.datadist.link", format!("{DECODER} {iaddr}"));

        // the prompt pushes to the decoder twice: before its link back exists (it is made by
        // this push) and after the forger says again that the decoder unlinked
        let key = RemoteCache::Blocks {
            cluster_id: DECODER,
            model_id: MODEL,
        };
        for push in 0..2 {
            if push == 1 {
                forge("hixl.datadist.unlink", DECODER.to_string());
            }
            let src: Vec<u64> = (0..3).map(|_| rng.below(BLOCKS)).collect();
            let dst: Vec<u64> = vec![push * 8, push * 8 + 1, push * 8 + 2];
            match prompt.push(pid, &key, 0, Some((&src, &dst)), &Layers::all()) {
                Ok(()) => {
                    for t in 0..TENSORS as usize {
                        for (&s, &d) in src.iter().zip(&dst) {
                            let (s, d) = ((s * BLOCK) as usize, (d * BLOCK) as usize);
                            let b = pk[t][s..s + BLOCK as usize].to_vec();
                            theirs[t][d..d + BLOCK as usize].copy_from_slice(&b);
                        }
                    }
                }
                Err(e) => {
                    eprintln!("round {round}, push {push}: {e}");
                    failed += 1;
                }
            }
        }
        impostor.finalize();
        if ik.iter().any(|t| t.iter().any(|&b| b != 0)) {
            eprintln!("round {round}: the impostor got the prompt's blocks");
            redirected += 1;
        }
        forger.finalize();
        prompt.finalize();
        if (0..TENSORS as usize).any(|t| decoder.sum(t, 0, len as u64) != fnv1a(&theirs[t])) {
            missing += 1;
        }
        decoder.quit();
    }
    eprintln!(
        "forged notes: of {ROUNDS} rounds, {redirected} pushed to the impostor, {missing} left \
         the decoder without the prompt's bytes; {failed} pushes failed"
    );
    assert_eq!((redirected, missing, failed), (0, 0, 0));
}

/// A prompt cluster of this process with a blocks cache, pushing to decoders in processes of
/// their own (`Peer`) that link to it.
struct Pusher {
    prompt: DataDist,
    cluster: u64,
    pid: i64,
    pk: Vec<Vec<u8>>,
}

impl Pusher {
    fn new(cluster: u64, opts: &[(&str, &str)]) -> Pusher {
        let prompt = listening_with(cluster, Role::Prompt, opts);
        let mut pk: Vec<Vec<u8>> = (0..TENSORS as u64)
            .map(|t| Rng::new(70 + t).bytes((BLOCKS * BLOCK) as usize))
            .collect();
        let pid = register(&prompt, &mut pk, 0);
        Pusher {
            prompt,
            cluster,
            pid,
            pk,
        }
    }

    /// A decoder process (its tensors the `Rng` bytes of `seed + t`) linked to the prompt, and
    /// what its tensors hold.
    fn decoder(&self, seed: u64) -> (Peer, Vec<Vec<u8>>) {
        let mut d = Peer::spawn(DECODER, TENSORS, BLOCKS, BLOCK, seed, MODEL);
        let at = self.prompt.listen_addr().unwrap();
        assert_eq!(d.link(self.cluster, at), LlmStatus::LLM_SUCCESS);
        let held = (0..TENSORS as u64)
            .map(|t| Rng::new(seed + t).bytes((BLOCKS * BLOCK) as usize))
            .collect();
        (d, held)
    }

    /// Pushes three blocks to the decoder cluster and checks the whole of each of `decoder`'s
    /// tensors: what `theirs` held, with those blocks.
    fn push_to(&self, decoder: &mut Peer, theirs: &mut [Vec<u8>], what: &str) {
        let key = RemoteCache::Blocks {
            cluster_id: DECODER,
            model_id: MODEL,
        };
        let (src, dst) = ([3, 4, 9], [0, 1, 15]);
        (self.prompt)
            .push(self.pid, &key, 0, Some((&src, &dst)), &Layers::all())
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        for (t, (ours, theirs)) in self.pk.iter().zip(theirs.iter_mut()).enumerate() {
            for (&s, &d) in src.iter().zip(&dst) {
                let (s, d) = ((s * BLOCK) as usize, (d * BLOCK) as usize);
                theirs[d..d + BLOCK as usize].copy_from_slice(&ours[s..s + BLOCK as usize]);
            }
            let len = theirs.len() as u64;
            assert_eq!(decoder.sum(t, 0, len), fnv1a(theirs), "{what}, tensor {t}");
        }
    }
}

/// A decoder that crashed and comes back (a new process, on another port) links to the prompt
/// again, and the prompt's next push lands in the new process, whether the prompt had linked
/// back to the old process (its link gives way: before, the note found the cluster linked
/// already and every push failed until the prompt unlinked a cluster it never linked) or had
/// only its binding (before, the note found the cluster bound to another engine and every
/// push tried the dead one's address). A live decoder keeps its cluster: another process
/// claiming its id gets nothing. Over the same-host path (the old process's pidfd) and over
/// TCP (a PING finds its connection reset).
#[test]
fn a_crashed_decoder_that_links_again_gets_the_prompts_pushes() {
    for opts in [&[][..], &[("hixl.SameHost", "off")][..]] {
        // linked back to, then crashed
        let p = Pusher::new(100, opts);
        let (mut d0, mut theirs) = p.decoder(80);
        p.push_to(&mut d0, &mut theirs, &format!("{opts:?} d0"));
        d0.kill();
        let (mut d1, mut theirs) = p.decoder(90);
        p.push_to(&mut d1, &mut theirs, &format!("{opts:?} d1"));
        // a live decoder keeps its cluster
        let (mut other, before) = p.decoder(99);
        p.push_to(&mut d1, &mut theirs, &format!("{opts:?} d1 again"));
        for (t, before) in before.iter().enumerate() {
            let len = before.len() as u64;
            assert_eq!(other.sum(t, 0, len), fnv1a(before), "{opts:?}: the claim");
        }
        other.quit();
        d1.kill();
        p.prompt.finalize();

        // bound only (never linked back to), then crashed
        let p = Pusher::new(101, opts);
        let (gone, _) = p.decoder(95);
        gone.kill();
        let (mut d2, mut theirs) = p.decoder(100);
        p.push_to(&mut d2, &mut theirs, &format!("{opts:?} d2"));
        d2.kill();
        p.prompt.finalize();
    }
}

#[test]
fn a_link_note_names_its_own_sender_and_a_gone_one_fails_the_push_with_a_link_error() {
    // a malformed note, one naming this cluster, one naming an address that is not its
    // sender's: ignored. One from an engine that named itself, which then went away: the push
    // there fails with LLM_LINK_FAILED
    let prompt = listening(0, Role::Prompt);
    let paddr = prompt.listen_addr().unwrap().to_string();
    let mut pk = vec![Rng::new(21).bytes((BLOCKS * BLOCK) as usize)];
    let pid = register(&prompt, &mut pk, 0);
    let forger = compat::Hixl::new();
    forger
        .initialize("127.0.0.1:0", [("AutoConnect", "0")])
        .unwrap();
    let faddr = forger.local_engine().unwrap();
    forger.connect(&paddr, 10_000).unwrap();
    let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let other = other.local_addr().unwrap();
    for msg in [
        "".to_owned(),
        "x 127.0.0.1:1".to_owned(),
        "5".to_owned(),
        "6 not-an-address".to_owned(),
        format!("0 {faddr}"),
        format!("8 {other}"),
        format!("9 {faddr}"),
        "\u{0}\u{ffff} \u{0}".to_owned(),
    ] {
        let note = NotifyDesc {
            name: "hixl.datadist.link".into(),
            notify_msg: msg,
        };
        forger.send_notify(&paddr, &note, 10_000).unwrap();
    }
    forger.finalize();
    let push_to = |cluster_id| {
        let key = RemoteCache::Blocks {
            cluster_id,
            model_id: 0,
        };
        let r = prompt.push(pid, &key, 0, Some((&[0], &[0])), &Layers::all());
        r.expect_err("no cluster to push to").status
    };
    assert_eq!(push_to(5), LlmStatus::LLM_NOT_YET_LINK, "malformed");
    assert_eq!(push_to(6), LlmStatus::LLM_NOT_YET_LINK, "malformed");
    assert_eq!(push_to(8), LlmStatus::LLM_NOT_YET_LINK, "not its sender's");
    assert_eq!(push_to(9), LlmStatus::LLM_LINK_FAILED, "its sender is gone");
    assert_eq!(push_to(0), LlmStatus::LLM_PARAM_INVALID, "its own cluster");
    prompt.finalize();
}
