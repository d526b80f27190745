//go:build !linux

package cluster

import "syscall"

// procAttr puts a child in its own process group. Only Linux has Pdeathsig.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
