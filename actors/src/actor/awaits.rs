//! What an [`AsyncHandler`](super::AsyncHandler) can `.await`: a timer
//! ([`Sleep`]), an ask ([`AskFuture`]), room in a full mailbox
//! ([`TellFuture`]) and an I/O operation ([`IoFuture`]).
//!
//! Each is completed by the shard's own ring or by another actor's thread,
//! and wakes its task with the task's [`Waker`], which sends the actor's
//! shard a `Poll` envelope (a wake from the shard itself goes on its local
//! queue). Nothing here blocks or spins: a future that cannot finish now
//! registers its waker and returns `Pending`.
//!
//! Timers and I/O belong to the ring of the thread that polls them, so
//! [`Sleep`], [`AskFuture`]'s timeout and [`IoFuture`] are polled on the
//! actor's shard (they are not `Send`). [`TellFuture`] works from any
//! thread with any executor.

use std::any::Any;
use std::cell::RefCell;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskContext, Poll, Waker};
use std::time::Duration;

use super::{ActorRef, Handler, Message};
use crate::error::{AskError, TellError};
use crate::runtime::envelope::ReplyTo;
use crate::runtime::io::{IoDone, IoOp, PendingIo};
use crate::runtime::{lock, outbox, thread};

/// Cancels timer `token` of this thread's ring (a future dropped or done).
fn cancel(token: u64) {
    let _ = thread::with(|t| t.io.cancel_timer(&mut t.ring, token));
}

/// What a timer set on this thread reports to its future.
#[derive(Default)]
struct Fired {
    done: bool,
    waker: Option<Waker>,
}

/// Arms a timer on this thread's ring that marks `state` done and wakes
/// it after `d`; `None` when the ring cannot take another timer now.
fn arm(d: Duration, state: &Rc<RefCell<Fired>>) -> Option<u64> {
    let s = state.clone();
    let make = Box::new(move || {
        let mut s = s.borrow_mut();
        s.done = true;
        if let Some(w) = s.waker.take() {
            w.wake();
        }
        None // no envelope: the task is woken instead
    });
    thread::with(|t| t.io.add_timer(&mut t.ring, d, None, make)).ok().flatten()
}

/// Completes after a delay, driven by a timeout on the shard's ring. See
/// [`Context::sleep`](super::Context::sleep).
#[must_use = "a future does nothing unless awaited"]
pub struct Sleep {
    delay: Duration,
    state: Rc<RefCell<Fired>>,
    timer: Option<u64>,
}

impl Sleep {
    pub(super) fn new(delay: Duration) -> Self {
        Sleep { delay, state: Rc::default(), timer: None }
    }
}

impl std::fmt::Debug for Sleep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sleep").field("delay", &self.delay).finish()
    }
}

impl Future for Sleep {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<()> {
        if self.state.borrow().done {
            self.timer = None;
            return Poll::Ready(());
        }
        self.state.borrow_mut().waker = Some(cx.waker().clone());
        if self.timer.is_none() {
            self.timer = arm(self.delay, &self.state);
            if self.timer.is_none() {
                // The ring has no room for another timer now: try again on
                // the next turn of the shard's loop (which frees some).
                cx.waker().wake_by_ref();
            }
        }
        Poll::Pending
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        if let Some(t) = self.timer.take() {
            if !self.state.borrow().done {
                cancel(t);
            }
        }
    }
}

/// The shared state of one ask: the answer (from the replier's thread or
/// the timeout) and the waker of the asking task.
struct Answer<R, M> {
    value: Option<Result<R, AskError<M>>>,
    waker: Option<Waker>,
    /// The future is gone: nobody will take an answer.
    dropped: bool,
}

type Shared<R, M> = Arc<Mutex<Answer<R, M>>>;

/// Gives the ask its answer, unless the other one (reply or timeout) came
/// first or the future is gone; true when it was taken.
fn answer<R, M>(shared: &Shared<R, M>, value: Result<R, AskError<M>>) -> bool {
    let waker = {
        let mut a = lock(shared);
        if a.value.is_some() || a.dropped {
            return false;
        }
        a.value = Some(value);
        a.waker.take()
    };
    if let Some(w) = waker {
        w.wake();
    }
    true
}

/// The answer to an ask from an async handler: the reply,
/// [`AskError::Timeout`], or [`AskError::NoReply`]. See
/// [`Context::ask_async`](super::Context::ask_async).
#[must_use = "the request is sent already; await it for the answer"]
pub struct AskFuture<R, M> {
    shared: Shared<R, M>,
    timer: Option<u64>,
    fired: Rc<RefCell<Fired>>,
}

impl<R, M> std::fmt::Debug for AskFuture<R, M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AskFuture").field("answered", &lock(&self.shared).value.is_some()).finish()
    }
}

impl<R: Send + 'static, M: Send + 'static> AskFuture<R, M> {
    /// Sends `msg` to `target` now (parking it when the target's mailbox is
    /// full, as `tell` does in a handler) with a timeout on this shard.
    pub(super) fn start<B: Handler<M>>(target: &ActorRef<B>, msg: M, timeout: Duration) -> Self
    where
        M: Message<Reply = R>,
    {
        let shared: Shared<R, M> =
            Arc::new(Mutex::new(Answer { value: None, waker: None, dropped: false }));
        let fired = Rc::<RefCell<Fired>>::default();
        let Some(timer) = arm(timeout, &fired) else {
            lock(&shared).value = Some(Err(AskError::Unavailable(msg)));
            return AskFuture { shared, timer: None, fired };
        };
        let on_reply = shared.clone();
        let reply = ReplyTo::callback(Box::new(move |value: Option<Box<dyn Any + Send>>| {
            let late = value.is_some();
            let value = match value {
                Some(v) => Ok(*v.downcast::<R>().expect("a reply has its ask's type")),
                None => Err(AskError::NoReply),
            };
            if !answer(&on_reply, value) && late {
                crate::runtime::dead_letter(); // a reply after the timeout, or to nobody
            }
        }));
        if let Err(e) = target.send_or_park(msg, Some(reply)) {
            cancel(timer);
            lock(&shared).value = Some(Err(e.into()));
            return AskFuture { shared, timer: None, fired };
        }
        AskFuture { shared, timer: Some(timer), fired }
    }
}

impl<R, M> Future for AskFuture<R, M> {
    type Output = Result<R, AskError<M>>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        if self.fired.borrow().done {
            self.timer = None;
            let _ = answer(&self.shared, Err(AskError::Timeout));
        }
        let mut a = lock(&self.shared);
        if let Some(v) = a.value.take() {
            drop(a);
            if let Some(t) = self.timer.take() {
                cancel(t); // answered before the timeout
            }
            return Poll::Ready(v);
        }
        a.waker = Some(cx.waker().clone());
        drop(a);
        // The timer wakes through `fired`; the reply through `shared`.
        self.fired.borrow_mut().waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

impl<R, M> Drop for AskFuture<R, M> {
    fn drop(&mut self) {
        lock(&self.shared).dropped = true;
        if let Some(t) = self.timer.take() {
            if !self.fired.borrow().done {
                cancel(t);
            }
        }
    }
}

/// A tell that waits for room: see [`ActorRef::tell_async`].
#[must_use = "a future does nothing unless awaited"]
pub struct TellFuture<A: Handler<M>, M: Message> {
    target: ActorRef<A>,
    msg: Option<M>,
    /// The waker of the latest poll, for the one registration below.
    waker: Arc<Mutex<Option<Waker>>>,
    /// A waker is registered on the target and has not run yet.
    armed: Arc<std::sync::atomic::AtomicBool>,
}

// Never pinned through: the message is moved out, never borrowed in place.
impl<A: Handler<M>, M: Message> Unpin for TellFuture<A, M> {}

impl<A: Handler<M>, M: Message> std::fmt::Debug for TellFuture<A, M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TellFuture").field("target", &self.target.id()).finish()
    }
}

impl<A: Handler<M>, M: Message> TellFuture<A, M> {
    pub(super) fn new(target: ActorRef<A>, msg: M) -> Self {
        TellFuture { target, msg: Some(msg), waker: Arc::default(), armed: Arc::default() }
    }
}

impl<A: Handler<M>, M: Message> Future for TellFuture<A, M> {
    type Output = Result<(), TellError<M>>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        let mut msg = self.msg.take().expect("polled after it finished");
        loop {
            // Behind something this handler parked for the same target: it
            // queues there too (order per sender and target).
            if outbox::parked_for(&self.target.cell) {
                return Poll::Ready(self.target.send_or_park(msg, None));
            }
            match self.target.try_tell(msg) {
                Err(TellError::Full(m)) => msg = m,
                other => {
                    outbox::room_found();
                    return Poll::Ready(other);
                }
            }
            *lock(&self.waker) = Some(cx.waker().clone());
            if self.armed.swap(true, std::sync::atomic::Ordering::AcqRel) {
                // Registered already (an earlier poll): it will wake us.
                self.msg = Some(msg);
                return Poll::Pending;
            }
            let (slot, armed) = (self.waker.clone(), self.armed.clone());
            let wake = Box::new(move || {
                armed.store(false, std::sync::atomic::Ordering::Release);
                if let Some(w) = lock(&slot).take() {
                    w.wake();
                }
            });
            if !self.target.cell.add_waker(wake) {
                if outbox::await_room(&self.target.cell) {
                    // Waiting would close a cycle of actors waiting for each
                    // other's room: this one goes through past the bound.
                    outbox::room_found();
                    return Poll::Ready(self.target.send_past_bound(msg));
                }
                self.msg = Some(msg);
                return Poll::Pending; // woken when the mailbox drains or stops
            }
            // There was room when we registered: try again now.
        }
    }
}

impl<A: Handler<M>, M: Message> Drop for TellFuture<A, M> {
    fn drop(&mut self) {
        if self.msg.take().is_some() {
            // Dropped before it could send (its actor stopped while awaiting,
            // or the caller gave up): not sent, and counted.
            crate::runtime::dead_letter_in(Some(&self.target.shard.stats));
        }
    }
}

/// An I/O operation's completion: see [`Context::io_async`](super::Context::io_async).
#[must_use = "the operation is started already; await it for its result"]
pub struct IoFuture {
    state: Rc<RefCell<(Option<IoDone>, Option<Waker>)>>,
    _not_send: PhantomData<*const ()>,
}

impl std::fmt::Debug for IoFuture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoFuture").field("done", &self.state.borrow().0.is_some()).finish()
    }
}

impl IoFuture {
    pub(super) fn start(op: IoOp) -> Self {
        let state: Rc<RefCell<(Option<IoDone>, Option<Waker>)>> = Rc::default();
        let s = state.clone();
        let deliver = Box::new(move |d: IoDone| {
            let mut s = s.borrow_mut();
            s.0 = Some(d);
            if let Some(w) = s.1.take() {
                w.wake();
            }
            None
        });
        thread::start_io(PendingIo::prepare(op, deliver));
        IoFuture { state, _not_send: PhantomData }
    }
}

impl Future for IoFuture {
    type Output = IoDone;
    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<IoDone> {
        let mut s = self.state.borrow_mut();
        if let Some(d) = s.0.take() {
            return Poll::Ready(d);
        }
        s.1 = Some(cx.waker().clone());
        Poll::Pending
    }
}
