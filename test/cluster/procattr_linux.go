//go:build linux

package cluster

import "syscall"

// procAttr puts a child in its own process group (so Stop can signal the
// whole group) and asks the kernel to SIGKILL it if this process dies, so a
// killed test binary does not leak etcd or kube-apiserver.
//
// Pdeathsig fires when the OS thread that started the child exits, not
// only the process; Go keeps its threads unless a goroutine exits while
// locked with runtime.LockOSThread, so do not start a cluster from such a
// goroutine.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
