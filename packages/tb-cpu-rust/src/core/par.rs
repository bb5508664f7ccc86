//! Parallel loops for the kernels: on the calling thread's OpenMP team when PyTorch's libgomp
//! has been handed over (`set_openmp`), else on rayon's pool.
//!
//! Why OpenMP: PyTorch's eager ops run on a libgomp team whose workers spin for a while after
//! every parallel region. With a second pool (rayon) of as many threads as cores, a native call
//! that follows an eager op — every step of a training loop, every fallback node — has its
//! workers share cores with spinning OpenMP threads, and the join waits for the slowest one; a
//! call after an idle spell pays a futex wake-up of sleeping rayon workers and of the caller.
//! Running the same loops on PyTorch's own team removes both: the caller is thread 0, the
//! workers are the ones eager ops use (already spinning when ops follow each other), and the
//! thread count is `torch.get_num_threads()`.
//!
//! Each thread of the team owns a contiguous share of the tasks (thread t of T: tasks
//! t·n/T .. (t+1)·n/T) and claims its own first, then takes what is left of the others' shares
//! from atomic counters. On a quiet machine every call gives a thread the same tasks, so the
//! data a task reads (a weight's rows, a tile of a repeated GEMM) is still in that core's L2
//! from the call before; a thread that loses its core for a while takes fewer tasks instead of
//! holding the others up at the join (callers make several tasks per thread). A loop inside a
//! parallel region runs serially on the thread that reached it.

use std::any::Any;
use std::ffi::c_void;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::Mutex;

type GompParallel = unsafe extern "C" fn(unsafe extern "C" fn(*mut c_void), *mut c_void, u32, u32);
type OmpInt = unsafe extern "C" fn() -> i32;

static GOMP_PARALLEL: AtomicUsize = AtomicUsize::new(0);
static OMP_MAX_THREADS: AtomicUsize = AtomicUsize::new(0);
static OMP_IN_PARALLEL: AtomicUsize = AtomicUsize::new(0);
static OMP_THREAD_NUM: AtomicUsize = AtomicUsize::new(0);
/// 0: rayon, 1: OpenMP (when its entry points are known)
static POOL: AtomicU8 = AtomicU8::new(1);

/// Registers libgomp's `GOMP_parallel`, `omp_get_max_threads`, `omp_in_parallel` and
/// `omp_get_thread_num`.
///
/// # Safety
/// The addresses must be those functions of a libgomp (or ABI-compatible) library that stays
/// loaded for the life of the process.
pub unsafe fn set_openmp(parallel: usize, max_threads: usize, in_parallel: usize, thread_num: usize) -> Result<(), String> {
    if parallel == 0 || max_threads == 0 || in_parallel == 0 || thread_num == 0 {
        return Err("null OpenMP entry point".into());
    }
    OMP_MAX_THREADS.store(max_threads, Ordering::Release);
    OMP_IN_PARALLEL.store(in_parallel, Ordering::Release);
    OMP_THREAD_NUM.store(thread_num, Ordering::Release);
    GOMP_PARALLEL.store(parallel, Ordering::Release);
    Ok(())
}

/// Chooses the pool: "openmp" (needs `set_openmp` first) or "rayon".
pub fn set_pool(name: &str) -> Result<(), String> {
    match name {
        "rayon" => POOL.store(0, Ordering::Release),
        "openmp" if GOMP_PARALLEL.load(Ordering::Acquire) != 0 => POOL.store(1, Ordering::Release),
        "openmp" => return Err("no OpenMP runtime was registered (set_openmp)".into()),
        other => return Err(format!("unknown thread pool {other:?}: expected 'openmp' or 'rayon'")),
    }
    Ok(())
}

/// The pool loops run on now.
pub fn pool() -> &'static str {
    if omp().is_some() {
        "openmp"
    } else {
        "rayon"
    }
}

/// libgomp's entry points when loops should run on OpenMP: the OpenMP pool is chosen and this
/// thread is not one of rayon's workers. On a rayon worker (the LLM's fused step runs every
/// layer inside `rayon::scope`), a `GOMP_parallel` would start a second team of spinning
/// threads beside rayon's for every attention call, on the cores the GEMVs need.
fn omp() -> Option<(GompParallel, OmpInt, OmpInt)> {
    if POOL.load(Ordering::Relaxed) == 0 || rayon::current_thread_index().is_some() {
        return None;
    }
    let p = GOMP_PARALLEL.load(Ordering::Acquire);
    if p == 0 {
        return None;
    }
    // SAFETY: set_openmp stored the addresses of these functions (non-null).
    unsafe {
        Some((
            std::mem::transmute::<usize, GompParallel>(p),
            std::mem::transmute::<usize, OmpInt>(OMP_MAX_THREADS.load(Ordering::Acquire)),
            std::mem::transmute::<usize, OmpInt>(OMP_IN_PARALLEL.load(Ordering::Acquire)),
        ))
    }
}

/// Threads a loop started on this thread may use.
pub fn threads() -> usize {
    match omp() {
        // SAFETY: libgomp's omp_get_max_threads / omp_in_parallel take no arguments.
        Some((_, max, inpar)) => unsafe {
            if inpar() != 0 {
                1
            } else {
                max().max(1) as usize
            }
        },
        None => rayon::current_num_threads(),
    }
}

/// A task counter on its own cache line (the threads' shares are claimed concurrently).
#[repr(align(64))]
struct Share {
    next: AtomicUsize,
    end: usize,
}

struct Job<'a> {
    f: &'a (dyn Fn(usize) + Sync),
    /// thread t's share of the tasks, in order
    shares: Vec<Share>,
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

impl<'a> Job<'a> {
    fn new(f: &'a (dyn Fn(usize) + Sync), n: usize, threads: usize) -> Self {
        let shares = (0..threads)
            .map(|t| Share { next: AtomicUsize::new(t * n / threads), end: (t + 1) * n / threads })
            .collect();
        Job { f, shares, panic: Mutex::new(None) }
    }

    /// Runs thread `me`'s share, then what is left of the others' (the next share first).
    fn work(&self, me: usize) {
        let t = self.shares.len();
        for k in 0..t {
            let share = &self.shares[(me + k) % t];
            loop {
                let i = share.next.fetch_add(1, Ordering::Relaxed);
                if i >= share.end {
                    break;
                }
                // a panic must not unwind through libgomp's frames: keep it for the caller
                if let Err(e) = catch_unwind(AssertUnwindSafe(|| (self.f)(i))) {
                    for s in &self.shares {
                        s.next.store(s.end, Ordering::Relaxed);
                    }
                    if let Ok(mut slot) = self.panic.lock() {
                        slot.get_or_insert(e);
                    }
                    return;
                }
            }
        }
    }
}

unsafe extern "C" fn claim(data: *mut c_void) {
    // SAFETY: `for_each` passes a Job that outlives GOMP_parallel (which joins every thread).
    let job = unsafe { &*(data as *const Job) };
    // SAFETY: set_openmp stored omp_get_thread_num (no arguments) before any region started.
    let me = unsafe { std::mem::transmute::<usize, OmpInt>(OMP_THREAD_NUM.load(Ordering::Acquire))() };
    job.work(me.max(0) as usize);
}

/// Runs `f(t)` for every t in 0..n, in parallel when there is more than one task and thread.
pub fn for_each<F: Fn(usize) + Sync + Send>(n: usize, f: F) {
    if n == 0 {
        return;
    }
    if n == 1 {
        f(0);
        return;
    }
    match omp() {
        Some((parallel, max, inpar)) => {
            // SAFETY: see `threads`.
            let nt = unsafe {
                if inpar() != 0 {
                    1
                } else {
                    (max().max(1) as usize).min(n)
                }
            };
            if nt <= 1 {
                (0..n).for_each(f);
                return;
            }
            let job = Job::new(&f, n, nt);
            // SAFETY: `claim` only reads the job, which lives until GOMP_parallel has joined.
            unsafe { parallel(claim, &job as *const Job as *mut c_void, nt as u32, 0) };
            let panic = job.panic.lock().ok().and_then(|mut p| p.take());
            if let Some(p) = panic {
                resume_unwind(p);
            }
        }
        None => {
            use rayon::prelude::*;
            (0..n).into_par_iter().for_each(f);
        }
    }
}

/// Runs `row(r)` for every row, in parallel when the work is large enough to pay for it.
pub fn par_rows(rows: usize, work: usize, row: impl Fn(usize) + Sync) {
    if work >= 1 << 15 && rows > 1 {
        let tasks = (crate::core::par::threads() * 4).min(rows);
        let per = rows.div_ceil(tasks);
        crate::core::par::for_each(tasks, |t| (t * per..((t + 1) * per).min(rows)).for_each(&row));
    } else {
        (0..rows).for_each(row);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rayon_fallback_visits_every_task_once() {
        let hits: Vec<AtomicUsize> = (0..1000).map(|_| AtomicUsize::new(0)).collect();
        for_each(1000, |i| {
            hits[i].fetch_add(1, Ordering::Relaxed);
        });
        assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
        assert!(set_pool("openmp").is_err() || pool() == "openmp");
        assert!(set_pool("bogus").is_err());
    }

    #[test]
    fn each_thread_takes_its_own_share_first_then_the_rest() {
        let order = Mutex::new(Vec::new());
        let f = |i: usize| order.lock().unwrap().push(i);
        // alone (the others descheduled): its own share 3..6, then the next ones, each task once
        Job::new(&f, 10, 3).work(1);
        assert_eq!(*order.lock().unwrap(), vec![3, 4, 5, 6, 7, 8, 9, 0, 1, 2]);
        // three threads at once: every task exactly once, whoever takes it
        let hits: Vec<AtomicUsize> = (0..1000).map(|_| AtomicUsize::new(0)).collect();
        let g = |i: usize| {
            hits[i].fetch_add(1, Ordering::Relaxed);
        };
        let job = Job::new(&g, 1000, 3);
        std::thread::scope(|s| {
            for t in 0..3 {
                let job = &job;
                s.spawn(move || job.work(t));
            }
        });
        assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
        // fewer tasks than threads: empty shares
        let few = Mutex::new(Vec::new());
        let h = |i: usize| few.lock().unwrap().push(i);
        Job::new(&h, 2, 4).work(3);
        let mut got = few.into_inner().unwrap();
        got.sort();
        assert_eq!(got, vec![0, 1]);
    }

    #[test]
    fn a_panicking_task_stops_the_others_and_is_kept() {
        let ran = AtomicUsize::new(0);
        let f = |i: usize| {
            ran.fetch_add(1, Ordering::Relaxed);
            assert!(i != 2, "task 2 fails");
        };
        let job = Job::new(&f, 8, 2);
        job.work(0);
        job.work(1);
        assert_eq!(ran.load(Ordering::Relaxed), 3, "tasks 0, 1, 2 ran; nothing after the panic");
        assert!(job.panic.lock().unwrap().is_some());
    }

    thread_local! {
        /// Regions started from this thread (other tests may start some on theirs meanwhile).
        static FAKE_CALLS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }

    /// A one-thread OpenMP team: runs the region on the caller and counts the calls.
    unsafe extern "C" fn fake_parallel(f: unsafe extern "C" fn(*mut c_void), data: *mut c_void, _n: u32, _flags: u32) {
        FAKE_CALLS.with(|c| c.set(c.get() + 1));
        unsafe { f(data) };
    }
    extern "C" fn fake_max() -> i32 {
        2
    }
    extern "C" fn fake_in_parallel() -> i32 {
        0
    }
    extern "C" fn fake_thread_num() -> i32 {
        0
    }

    #[test]
    fn rayon_workers_never_start_an_openmp_team() {
        // SAFETY: the fakes stay valid for the whole process, and run every task (on one thread).
        let entry = (
            fake_parallel as GompParallel as usize,
            fake_max as OmpInt as usize,
            fake_in_parallel as OmpInt as usize,
            fake_thread_num as OmpInt as usize,
        );
        unsafe { set_openmp(entry.0, entry.1, entry.2, entry.3) }.unwrap();
        set_pool("openmp").unwrap();
        let hits: Vec<AtomicUsize> = (0..64).map(|_| AtomicUsize::new(0)).collect();
        let calls = || FAKE_CALLS.with(|c| c.get());
        let before = calls();
        for_each(64, |i| {
            hits[i].fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(calls(), before + 1, "a plain thread uses the OpenMP team");
        assert_eq!(pool(), "openmp");
        let inside = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        let started = inside.install(|| {
            let before = calls();
            for_each(64, |i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
            assert_eq!((pool(), threads()), ("rayon", 2));
            calls() - before
        });
        assert_eq!(started, 0, "a rayon worker started an OpenMP region");
        assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 2));
    }
}
