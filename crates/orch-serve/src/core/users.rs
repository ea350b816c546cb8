//! Unix identities: who a uid is, which groups they belong to (the system's user database, so
//! LDAP/SSSD users resolve as they do for `id`).

use std::ffi::{CStr, CString};

/// A user as the daemon runs their jobs.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Identity {
    pub uid: u32,
    pub gid: u32,
    pub name: String,
    /// Supplementary groups (gids), the primary one included.
    pub groups: Vec<u32>,
}

impl Identity {
    /// Looks `uid` up; `gid` is the peer's primary group as the socket reports it.
    pub fn of_uid(uid: u32, gid: u32) -> Identity {
        let (name, home_gid) = passwd(uid).unwrap_or_else(|| (uid.to_string(), gid));
        let groups = group_list(&name, home_gid).unwrap_or_else(|| vec![gid]);
        Identity {
            uid,
            gid,
            name,
            groups,
        }
    }

    /// The names of this user's groups.
    pub fn group_names(&self) -> Vec<String> {
        self.groups.iter().filter_map(|&g| group_name(g)).collect()
    }
}

/// The uid running this process.
pub fn current_uid() -> u32 {
    // SAFETY: getuid cannot fail.
    unsafe { libc::getuid() }
}

/// `(name, primary gid)` of `uid` from the user database.
fn passwd(uid: u32) -> Option<(String, u32)> {
    orch_exec::passwd_entry(uid)
}

/// The uid of user `name`.
pub fn uid_of(name: &str) -> Option<u32> {
    let c_name = CString::new(name).ok()?;
    let mut buf = vec![0u8; 16 * 1024];
    // SAFETY: passwd is plain data; getpwnam_r fills it with pointers into `buf`, which
    // outlives the read below.
    unsafe {
        let mut pwd: libc::passwd = std::mem::zeroed();
        let mut result: *mut libc::passwd = std::ptr::null_mut();
        let rc = libc::getpwnam_r(
            c_name.as_ptr(),
            &mut pwd,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut result,
        );
        (rc == 0 && !result.is_null()).then_some(pwd.pw_uid)
    }
}

/// The gid of group `name`.
pub fn gid_of(name: &str) -> Option<u32> {
    let c_name = CString::new(name).ok()?;
    let mut buf = vec![0u8; 64 * 1024];
    // SAFETY: as in `passwd`, for the group database (a group's member list can be long).
    unsafe {
        let mut grp: libc::group = std::mem::zeroed();
        let mut result: *mut libc::group = std::ptr::null_mut();
        let rc = libc::getgrnam_r(
            c_name.as_ptr(),
            &mut grp,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut result,
        );
        (rc == 0 && !result.is_null()).then_some(grp.gr_gid)
    }
}

fn group_list(name: &str, gid: u32) -> Option<Vec<u32>> {
    let c_name = CString::new(name).ok()?;
    let mut count: libc::c_int = 64;
    loop {
        let mut groups = vec![0 as libc::gid_t; count as usize];
        // SAFETY: `groups` has room for `count` entries; getgrouplist writes at most that many
        // and sets `count` to the number it needs.
        let rc =
            unsafe { libc::getgrouplist(c_name.as_ptr(), gid, groups.as_mut_ptr(), &mut count) };
        if rc >= 0 {
            groups.truncate(count as usize);
            return Some(groups);
        }
        if count as usize <= groups.len() || count > 65536 {
            return None;
        }
    }
}

fn group_name(gid: u32) -> Option<String> {
    let mut buf = vec![0u8; 16 * 1024];
    // SAFETY: as in `passwd`, for the group database.
    unsafe {
        let mut grp: libc::group = std::mem::zeroed();
        let mut result: *mut libc::group = std::ptr::null_mut();
        let rc = libc::getgrgid_r(
            gid,
            &mut grp,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut result,
        );
        if rc != 0 || result.is_null() {
            return None;
        }
        Some(CStr::from_ptr(grp.gr_name).to_string_lossy().into_owned())
    }
}
