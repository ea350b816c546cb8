//! The trainer host's functions called directly on a replica's state, as a hostile plugin would
//! call them: every failure it causes is a value, a bad handle a trap, and what the host keeps
//! for it stays bounded.

use super::*;
use crate::data::{Data, Samples};
use orch_host::Limits;
use orch_tensor::{Device, GraphBudget};
use orch_wit::trainer::orch::plugin::autograd::Host as _;
use orch_wit::trainer::orch::plugin::metrics::Host as Metrics;
use orch_wit::trainer::orch::plugin::optim::{
    HostOptimizer, OptimizerConfig, ParamGroup, SgdConfig,
};
use orch_wit::trainer::orch::plugin::params::Host as _;
use orch_wit::trainer::orch::plugin::tensors::{
    BinaryOp, Host as Tensors, HostTensor, ReduceOp, UnaryOp,
};

pub(super) type Handle = Resource<WitTensor>;

/// One replica's state on a simulated device of `bytes`, with the job's quota `quota`.
fn replica(bytes: u64, quota: Option<u64>, max_graph_nodes: usize) -> ReplicaState {
    let device = MemoryPool::new(Device::Sim(0), Some(bytes)).expect("sim pool");
    let pool = MemoryPool::with_parent(&device, quota);
    let dataset = Arc::new(Samples::Table(orch_data::Dataset {
        features: vec![0.0; 4],
        labels: vec![0, 1],
        feature_dim: 2,
        sample_shape: vec![2],
        num_classes: 2,
    }));
    let shared = Arc::new(Shared {
        devices: vec![DeviceSlot {
            pool,
            kind: "sim:0".into(),
            name: "sim".into(),
            memory_free: Some(bytes),
            quota,
        }],
        data: Data {
            train: dataset,
            eval: None,
            classes: 2,
            vocab: None,
        },
        replicas: 1,
        seed: 7,
        max_tensors: 64,
        max_graph_nodes,
        exchange_timeout: Duration::from_secs(1),
        grads: Collective::new(1),
        broadcast: Collective::new(1),
        checkpoints: Collective::new(1),
        stops: Collective::new(1),
    });
    ReplicaState::new(PluginState::new("hostile", &Limits::default()), shared, 0)
}

pub(super) fn state() -> ReplicaState {
    replica(1 << 30, None, 1000)
}

pub(super) fn borrow(h: &Handle) -> Handle {
    Resource::new_borrow(h.rep())
}

pub(super) fn value<T: std::fmt::Debug>(answer: wasmtime::Result<Result<T, WitError>>) -> T {
    answer.expect("no trap").expect("a value")
}

pub(super) fn error<T: std::fmt::Debug>(answer: wasmtime::Result<Result<T, WitError>>) -> WitError {
    answer.expect("no trap").expect_err("an error value")
}

pub(super) fn full(s: &mut ReplicaState, shape: &[u32], v: f32) -> Handle {
    value(s.full(shape.to_vec(), v, None))
}

fn param(s: &mut ReplicaState, name: &str, shape: &[u32]) -> Handle {
    let init = full(s, shape, 1.0);
    s.phase = Phase::Init;
    let p = value(s.register(name.into(), borrow(&init)));
    s.phase = Phase::Idle;
    p
}

/// Finding: a chain of cheap ops on a zero-element parameter grew host memory without bound.
#[test]
fn graph_nodes_are_bounded_per_replica_and_refused_as_a_value() {
    let mut s = replica(1 << 30, None, 50);
    let p = param(&mut s, "p", &[0]);
    let mut y = borrow(&p);
    let mut held = Vec::new();
    let refused = loop {
        match Tensors::scalar(&mut s, BinaryOp::Add, borrow(&y), 1.0).expect("no trap") {
            Ok(next) => {
                y = borrow(&next);
                held.push(next);
            }
            Err(e) => break e,
        }
        assert!(held.len() <= 50, "the bound is never passed");
    };
    assert!(
        matches!(refused, WitError::TooManyTensors(50)),
        "{refused:?}"
    );
    assert_eq!(held.len(), 50);
    assert_eq!(s.graph.live(), 50);
    // Dropping the handles drops the graph; the budget comes back.
    for h in held {
        HostTensor::drop(&mut s, h).unwrap();
    }
    assert_eq!(s.graph.live(), 0);
    value(Tensors::scalar(&mut s, BinaryOp::Add, borrow(&p), 1.0));
}

/// Finding: a host panic blamed "the WebAssembly engine" and named neither call nor plugin.
#[test]
fn a_panic_in_a_host_function_is_a_trap_naming_the_call() {
    let mut s = state();
    let trap = s
        .run("tensors.cross-entropy", |_| -> Result<(), Fail> {
            panic!("chunk size must be non-zero")
        })
        .expect_err("a trap");
    assert!(
        trap.to_string()
            .contains("orch failed inside `tensors.cross-entropy`: chunk size must be non-zero"),
        "{trap}"
    );
    assert_eq!(
        s.host_panic,
        Some((
            "tensors.cross-entropy",
            "chunk size must be non-zero".to_string()
        ))
    );
    // The replica is stopped: later calls trap too.
    assert!(s.full(vec![1], 0.0, None).is_err());
    let err = crate::TrainError::HostPanic {
        plugin: "hostile".into(),
        stage: crate::Stage::Step { step: 2, epoch: 0 },
        call: "tensors.cross-entropy",
        message: "boom".into(),
    };
    assert_eq!(
        err.to_string(),
        "orch failed inside `tensors.cross-entropy`, called by trainer `hostile` at step 3 (epoch 1): boom; this is a bug in orch, please report it"
    );
}

/// Finding: cross-entropy of logits with zero classes panicked the host.
#[test]
fn zero_size_shapes_through_the_contract_are_values() {
    let mut s = state();
    let logits = full(&mut s, &[3, 0], 0.0);
    let labels = full(&mut s, &[3], 0.0);
    let err = error(s.cross_entropy(borrow(&logits), borrow(&labels)));
    assert!(matches!(err, WitError::BadArgument(_)), "{err:?}");
    let err = error(s.correct(borrow(&logits), borrow(&labels)));
    assert!(matches!(err, WitError::BadArgument(_)), "{err:?}");
    let err = error(s.argmax(borrow(&logits), 1));
    assert!(matches!(err, WitError::BadArgument(_)), "{err:?}");
    let empty = full(&mut s, &[0, 4], 0.0);
    let none = full(&mut s, &[0], 0.0);
    let loss = value(s.cross_entropy(borrow(&empty), borrow(&none)));
    assert_eq!(value(s.item(borrow(&loss))), 0.0);
    assert_eq!(value(s.correct(borrow(&empty), borrow(&none))), 0);
    let sum = value(s.reduce(ReduceOp::Sum, borrow(&logits), vec![], false));
    assert_eq!(value(s.item(borrow(&sum))), 0.0);
}

/// Finding: a matmul made a tensor of 2^64 elements that other ops then accepted.
#[test]
fn a_product_with_too_many_elements_is_refused() {
    let mut s = state();
    let big = 65536;
    let a = full(&mut s, &[big, big, big, 0], 0.0);
    let b = full(&mut s, &[0, big], 0.0);
    let err = error(s.matmul(borrow(&a), borrow(&b), false, false));
    assert!(
        matches!(&err, WitError::BadArgument(m) if m.contains("matmul") && m.contains("elements")),
        "{err:?}"
    );
    let err = error(s.full(vec![1; 40], 0.0, None));
    assert!(
        matches!(&err, WitError::BadArgument(m) if m.contains("at most 32")),
        "{err:?}"
    );
}

/// Finding: after creating and dropping 16 optimizers, none could be created again.
#[test]
fn dropped_optimizers_do_not_count_against_the_cap() {
    let mut s = state();
    param(&mut s, "w", &[2]);
    s.phase = Phase::Init;
    let sgd = || {
        OptimizerConfig::Sgd(SgdConfig {
            lr: 0.1,
            momentum: 0.0,
            weight_decay: 0.0,
            nesterov: false,
        })
    };
    for _ in 0..40 {
        let opt = value(HostOptimizer::create(&mut s, sgd()));
        HostOptimizer::drop(&mut s, opt).unwrap();
    }
    let live: Vec<_> = (0..16)
        .map(|_| value(HostOptimizer::create(&mut s, sgd())))
        .collect();
    let err = error(HostOptimizer::create(&mut s, sgd()));
    assert!(matches!(err, WitError::BadArgument(_)), "{err:?}");
    assert_eq!(s.optimizers.len(), 16, "freed slots are reused");
    drop(live);
}

/// Finding: a parameter registered after `init` made the run's checkpoint unresumable.
#[test]
fn register_and_optimizer_create_are_for_init_only() {
    let mut s = state();
    let init = full(&mut s, &[2], 1.0);
    for phase in [Phase::Idle, Phase::Train(BatchSlot::default())] {
        s.phase = phase;
        let err = error(s.register("late".into(), borrow(&init)));
        assert!(matches!(err, WitError::NotNow(_)), "{err:?}");
    }
    assert!(s.params.is_empty());
    s.phase = Phase::Init;
    value(s.register("early".into(), borrow(&init)));
    s.phase = Phase::Idle;
    let adam = OptimizerConfig::Sgd(SgdConfig {
        lr: 0.1,
        momentum: 0.0,
        weight_decay: 0.0,
        nesterov: false,
    });
    let err = error(HostOptimizer::create(&mut s, adam));
    assert!(matches!(err, WitError::NotNow(_)), "{err:?}");
}

/// Finding: `correct` counted labels that cross-entropy refuses.
#[test]
fn correct_refuses_labels_that_are_not_class_indices() {
    let mut s = state();
    let logits = value(s.from_list(vec![0.0, 1.0, 1.0, 0.0], vec![2, 2], None));
    for bad in [f32::NAN, -1.0, 1e30, 2.5, 2.0] {
        let labels = value(s.from_list(vec![1.0, bad], vec![2], None));
        let err = error(s.correct(borrow(&logits), borrow(&labels)));
        assert!(
            matches!(&err, WitError::BadArgument(m) if m.contains("not a class index")),
            "{bad}: {err:?}"
        );
    }
    let labels = value(s.from_list(vec![1.0, 1.0], vec![2], None));
    assert_eq!(value(s.correct(borrow(&logits), borrow(&labels))), 1);
}

/// Finding: scalar names sharing their first 64 characters merged; log lines past 64 per call
/// vanished without a word.
#[test]
fn metrics_say_what_they_cut() {
    let mut s = state();
    let long = "x".repeat(70);
    Metrics::scalar(&mut s, format!("{long}a"), 1.0).unwrap();
    Metrics::scalar(&mut s, format!("{long}b"), 2.0).unwrap();
    Metrics::scalar(&mut s, "loss".into(), f64::NAN).unwrap();
    for i in 0..70 {
        s.log(Level::Info, format!("line {i}")).unwrap();
    }
    s.log(Level::Info, "y".repeat(1500)).unwrap();
    assert_eq!(s.scalars.len(), 1, "no merged names");
    assert!(s.scalars[0].1.is_nan(), "NaN kept as it is");
    assert_eq!(s.logs.len(), 64);
    let (level, notice) = s.take_cut_notice().expect("a notice");
    assert_eq!(level, Level::Warn);
    assert!(
        notice.contains("7 log lines past the first 64 were dropped")
            && notice.contains("2 scalars were dropped for their names"),
        "{notice}"
    );
    assert!(s.take_cut_notice().is_none(), "said once");
    s.logs.clear();
    s.log(Level::Info, "z".repeat(1500)).unwrap();
    assert!(s.logs.last().is_some_and(|(_, l)| l.ends_with("[cut]")));
    let notice = s.take_cut_notice().expect("a notice").1;
    assert!(notice.contains("cut at 1000 characters"), "{notice}");
}

/// Findings: duplicate axes read "shape [] is not valid here"; a request past the quota
/// reported the device's size and a saturated byte count.
#[test]
fn messages_name_the_axis_and_the_quota() {
    let mut s = replica(1 << 30, Some(1 << 20), 1000);
    let x = full(&mut s, &[2, 3], 0.0);
    let err = error(s.reduce(ReduceOp::Sum, borrow(&x), vec![1, -1], false));
    assert!(
        matches!(&err, WitError::BadArgument(m)
            if m == "sum: axis list [1, -1] names an axis twice (a tensor of rank 2)"),
        "{err:?}"
    );
    let err = error(s.full(vec![1 << 20, 1 << 20], 0.0, None));
    let WitError::OutOfMemory(oom) = err else {
        panic!("{err:?}");
    };
    assert_eq!((oom.requested, oom.limit), (1 << 42, 1 << 20));
    let err = error(s.full(vec![u32::MAX; 4], 0.0, None));
    assert!(
        matches!(&err, WitError::BadArgument(m) if m.contains("elements")),
        "{err:?}"
    );
}

/// Finding: a bad handle was answered with `[]`, `u32::MAX` or `false`.
#[test]
fn a_bad_handle_traps() {
    let mut s = state();
    let made_up = || Resource::<WitTensor>::new_borrow(0x0bad);
    let trap = s.shape(made_up()).expect_err("a trap").to_string();
    assert!(
        trap.contains("tensor.shape") && trap.contains("handle"),
        "{trap}"
    );
    assert!(s.device(made_up()).is_err());
    assert!(s.requires_grad(made_up()).is_err());
    assert!(s.item(made_up()).is_err());
    assert!(s.to_list(made_up()).is_err());
    assert!(s.unary(UnaryOp::Neg, made_up()).is_err());
    assert!(s.backward(made_up()).is_err());
    let opt = Resource::<orch_wit::trainer::orch::plugin::optim::Optimizer>::new_borrow(7);
    assert!(HostOptimizer::lr(&mut s, Resource::new_borrow(opt.rep())).is_err());
    assert!(HostOptimizer::zero_grad(&mut s, Resource::new_borrow(opt.rep())).is_err());
    assert!(HostOptimizer::step(&mut s, opt).is_err());
}

/// The budget a replica runs under is its own.
#[test]
fn each_replica_has_a_budget_of_its_own() {
    let (a, b) = (replica(1 << 30, None, 10), replica(1 << 30, None, 10));
    assert!(!Arc::ptr_eq(&a.graph, &b.graph));
    assert_eq!(a.graph.limit(), GraphBudget::new(10).limit());
}

// ---- contract 0.3.0 ----

fn list(s: &mut ReplicaState, values: &[f32], shape: &[u32]) -> Handle {
    value(s.from_list(values.to_vec(), shape.to_vec(), None))
}

fn values(s: &mut ReplicaState, h: &Handle) -> Vec<f32> {
    value(s.to_list(borrow(h)))
}

fn sgd(lr: f32) -> OptimizerConfig {
    OptimizerConfig::Sgd(SgdConfig {
        lr,
        momentum: 0.0,
        weight_decay: 0.0,
        nesterov: false,
    })
}

/// A parameter holding `init`, registered in init.
fn param_of(s: &mut ReplicaState, name: &str, init: &[f32]) -> Handle {
    let shape = [u32::try_from(init.len()).unwrap()];
    let t = list(s, init, &shape);
    s.phase = Phase::Init;
    let p = value(s.register(name.into(), borrow(&t)));
    s.phase = Phase::Idle;
    p
}

/// `sum(p^2) / 2` backward: the gradient is `p`.
fn half_square_backward(s: &mut ReplicaState, params: &[&Handle]) {
    let mut total = None;
    for p in params {
        let sq = value(s.unary(UnaryOp::Sqr, borrow(p)));
        let sum = value(s.reduce(ReduceOp::Sum, borrow(&sq), vec![], false));
        total = Some(match total {
            None => sum,
            Some(t) => value(s.binary(BinaryOp::Add, borrow(&t), borrow(&sum))),
        });
    }
    let loss = value(Tensors::scalar(
        s,
        BinaryOp::Mul,
        borrow(&total.unwrap()),
        0.5,
    ));
    value(s.backward(borrow(&loss)));
}

#[test]
fn step_clipped_returns_the_global_norm_and_scales_as_clip_grad_norm() {
    let mut s = state();
    let a = param_of(&mut s, "a", &[1.0, 2.0]);
    let b = param_of(&mut s, "b", &[2.0, 4.0]);
    s.phase = Phase::Init;
    let opt = value(HostOptimizer::create(&mut s, sgd(1.0)));
    s.phase = Phase::Idle;
    half_square_backward(&mut s, &[&a, &b]);
    // By hand: the gradients are a and b, their norm sqrt(1 + 4 + 4 + 16) = 5.
    let norm = value(s.step_clipped(Resource::new_borrow(opt.rep()), 2.5));
    assert!((norm - 5.0).abs() < 1e-6, "{norm}");
    // Scaled by 2.5 / (5 + 1e-6): each parameter loses about half of itself.
    let coef = 2.5 / (5.0 + 1e-6);
    for (p, init) in [(&a, [1.0f32, 2.0]), (&b, [2.0, 4.0])] {
        let got = values(&mut s, p);
        for (g, i) in got.iter().zip(init) {
            assert!((g - (i - i * coef as f32)).abs() < 1e-6, "{got:?}");
        }
    }
    // Under the bound nothing is scaled.
    HostOptimizer::zero_grad(&mut s, Resource::new_borrow(opt.rep())).unwrap();
    half_square_backward(&mut s, &[&a, &b]);
    let before = values(&mut s, &a);
    let norm = value(s.step_clipped(Resource::new_borrow(opt.rep()), 100.0));
    assert!((norm - 2.5).abs() < 1e-5, "{norm}");
    let after = values(&mut s, &a);
    assert!(
        (after[0] - (before[0] - before[0])).abs() < 1e-6,
        "{after:?}"
    );
    assert!(matches!(
        error(s.step_clipped(Resource::new_borrow(opt.rep()), -1.0)),
        WitError::BadArgument(_)
    ));
}

#[test]
fn parameter_groups_have_their_own_learning_rates() {
    let mut s = state();
    let a = param_of(&mut s, "a", &[1.0]);
    let b = param_of(&mut s, "b", &[1.0]);
    let group = |name: &str, lr| ParamGroup {
        params: vec![name.to_string()],
        lr,
        weight_decay: 0.0,
    };
    s.phase = Phase::Init;
    let opt = value(s.create_grouped(sgd(9.0), vec![group("a", 0.5), group("b", 0.25)]));
    // What a bad group list gets.
    for bad_groups in [
        vec![],
        vec![group("nope", 0.1)],
        vec![group("a", 0.1), group("a", 0.1)],
        vec![ParamGroup {
            params: vec![],
            lr: 0.1,
            weight_decay: 0.0,
        }],
        vec![group("a", -1.0)],
    ] {
        let e = error(s.create_grouped(sgd(0.1), bad_groups));
        assert!(matches!(e, WitError::BadArgument(_)), "{e:?}");
    }
    s.phase = Phase::Idle;
    let this = || Resource::new_borrow(opt.rep());
    assert_eq!(s.groups(this()).unwrap(), 2);
    half_square_backward(&mut s, &[&a, &b]);
    value(HostOptimizer::step(&mut s, this()));
    assert_eq!(values(&mut s, &a), vec![0.5]);
    assert_eq!(values(&mut s, &b), vec![0.75]);
    value(s.set_group_lr(this(), 1, 0.0));
    assert_eq!(value(s.group_lr(this(), 1)), 0.0);
    assert_eq!(value(s.group_lr(this(), 0)), 0.5);
    assert!(matches!(
        error(s.group_lr(this(), 2)),
        WitError::BadArgument(_)
    ));
    value(s.set_lr(this(), 0.125));
    assert_eq!(value(s.group_lr(this(), 1)), 0.125);
}

#[test]
fn buffers_are_named_apart_from_parameters_and_collect_no_gradient() {
    let mut s = state();
    let p = param_of(&mut s, "w", &[1.0, 2.0]);
    let init = list(&mut s, &[0.0, 0.0], &[2]);
    assert!(matches!(
        error(s.register_buffer("late".into(), borrow(&init))),
        WitError::NotNow(_)
    ));
    s.phase = Phase::Init;
    let buffer = value(s.register_buffer("running".into(), borrow(&init)));
    for name in ["w", "running", ""] {
        let e = error(s.register_buffer(name.into(), borrow(&init)));
        assert!(matches!(e, WitError::BadArgument(_)), "{name}: {e:?}");
    }
    assert!(matches!(
        error(s.register("running".into(), borrow(&init))),
        WitError::BadArgument(_)
    ));
    s.phase = Phase::Idle;
    assert_eq!(s.buffer_names().unwrap(), vec!["running".to_string()]);
    assert_eq!(s.names().unwrap(), vec!["w".to_string()]);
    assert!(!s.requires_grad(borrow(&buffer)).unwrap());
    // A loss through the buffer gives the parameter a gradient and the buffer none.
    let y = value(s.binary(BinaryOp::Mul, borrow(&p), borrow(&buffer)));
    let loss = value(s.reduce(ReduceOp::Sum, borrow(&y), vec![], false));
    value(s.backward(borrow(&loss)));
    assert!(value(s.grad(borrow(&buffer))).is_none());
    // Updated in place, outside autograd.
    let next = list(&mut s, &[3.0, 4.0], &[2]);
    value(s.assign(borrow(&buffer), borrow(&next)));
    assert_eq!(s.buffers[0].1.to_vec().unwrap(), vec![3.0, 4.0]);
}

#[test]
fn bad_arguments_of_the_new_ops_are_values() {
    let mut s = state();
    let x = list(&mut s, &[1.0, 2.0, 3.0, 4.0], &[2, 2]);
    let table = list(&mut s, &[0.0; 6], &[3, 2]);
    let out_of_table = list(&mut s, &[3.0], &[1]);
    let far = list(&mut s, &[5.0, 0.0], &[2, 1]);
    let v = list(&mut s, &[1.0, 2.0, 3.0], &[3]);
    let one = list(&mut s, &[1.0], &[1, 1, 1]);
    let cases: Vec<(&str, WitError)> = vec![
        ("slice", error(s.slice(borrow(&x), 0, 0, 2, 0))),
        ("clamp", error(s.clamp(borrow(&x), 1.0, -1.0))),
        ("dropout", error(s.dropout(borrow(&x), 1.5))),
        (
            "embedding",
            error(s.embedding(borrow(&table), borrow(&out_of_table))),
        ),
        ("gather", error(s.gather(borrow(&x), 1, borrow(&far)))),
        ("pad", error(s.pad(borrow(&x), vec![(1, 1)], 0.0))),
        ("concat", error(s.concat(vec![borrow(&x), borrow(&v)], 0))),
        ("concat-empty", error(s.concat(vec![], 0))),
        ("split", error(s.split(borrow(&x), vec![1, 2], 0))),
        (
            "expand",
            error(s.expand(borrow(&one), vec![1 << 30, 1 << 30, 1 << 30])),
        ),
        (
            "ignore",
            error(s.cross_entropy_with(borrow(&x), borrow(&v), None)),
        ),
    ];
    for (what, e) in cases {
        let text = format!("{e:?}");
        assert!(
            matches!(
                e,
                WitError::BadArgument(_) | WitError::ShapeMismatch(_) | WitError::OutOfMemory(_)
            ),
            "{what}: {text}"
        );
    }
    // The reason is the op's own sentence.
    match error(s.slice(borrow(&x), 0, 0, 2, 0)) {
        WitError::BadArgument(m) => assert!(m.contains("step"), "{m}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn dropout_is_the_identity_outside_train_step_and_counts_sites_inside() {
    let mut s = state();
    let x = value(s.full(vec![4, 64], 1.0, None));
    let same = value(s.dropout(borrow(&x), 0.5));
    assert_eq!(values(&mut s, &same), vec![1.0; 256]);
    s.phase = Phase::Train(BatchSlot {
        step: 3,
        offset: 10,
        ..BatchSlot::default()
    });
    let first = value(s.dropout(borrow(&x), 0.5));
    let second = value(s.dropout(borrow(&x), 0.5));
    let (a, b) = (values(&mut s, &first), values(&mut s, &second));
    assert!(a.iter().all(|&v| v == 0.0 || v == 2.0), "{a:?}");
    assert_ne!(a, b, "two dropouts of one step draw different masks");
    // The mask is orch-tensor's for (seed 7, step 3, site 0, rows from 10).
    let pool = s.pool(None).unwrap();
    let native = orch_tensor::Tensor::full(&[4, 64], 1.0, &pool)
        .unwrap()
        .dropout(&orch_tensor::Dropout {
            p: 0.5,
            seed: 7,
            step: 3,
            site: 0,
            sample_offset: 10,
            training: true,
        })
        .unwrap();
    assert_eq!(a, native.to_vec().unwrap());
}

/// Finding: host ops ran past the call's deadline (the epoch deadline stops Wasm code, not
/// host code): a matmul of two expanded views and a pooling window as large as its input ran
/// for minutes. Under the call's deadline they end by it with an error value naming it, and
/// ordinary ops still run.
#[test]
fn host_ops_end_by_the_calls_deadline_with_an_error_value() {
    let mut s = state();
    let deadline = Duration::from_secs(1);
    s.deadline = Some(std::time::Instant::now() + deadline);
    let one = full(&mut s, &[1, 1], 1.0);
    let big = i32::MAX;
    let a = value(s.expand(borrow(&one), vec![256, big]));
    let b = value(s.expand(borrow(&one), vec![big, 256]));
    let started = std::time::Instant::now();
    let err = error(s.matmul(borrow(&a), borrow(&b), false, false));
    let WitError::Failed(text) = &err else {
        panic!("{err:?}")
    };
    assert!(
        text.starts_with("matmul: ") && text.contains("deadline"),
        "{text}"
    );
    let image = full(&mut s, &[1, 1, 1024, 1024], 0.5);
    let err = error(s.max_pool2d(borrow(&image), (1024, 1024), (1, 1), (512, 512)));
    assert!(
        matches!(&err, WitError::Failed(t) if t.contains("deadline")),
        "{err:?}"
    );
    assert!(started.elapsed() <= deadline + Duration::from_secs(1));
    let small = full(&mut s, &[2, 2], 1.0);
    let product = value(s.matmul(borrow(&small), borrow(&small), false, false));
    assert_eq!(values(&mut s, &product), vec![2.0; 4]);
}
