//! Locks that survive a panicking holder.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `m`, taking the data even when another thread panicked while holding it: every value
/// the project keeps behind a mutex stays consistent between statements, so a poisoned lock
/// means "a thread died", not "the data is torn", and refusing it would only spread the panic.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_poisoned_lock_still_gives_its_data() {
        let m = std::sync::Arc::new(std::sync::Mutex::new(5));
        let m2 = m.clone();
        let _ = std::thread::spawn(move || {
            let _guard = m2.lock().unwrap();
            panic!("poison it");
        })
        .join();
        assert!(m.is_poisoned());
        assert_eq!(*super::lock(&m), 5);
    }
}
