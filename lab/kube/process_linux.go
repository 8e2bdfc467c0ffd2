package kube

import "syscall"

const (
	sigTerm = syscall.SIGTERM
	sigKill = syscall.SIGKILL
)

// sysProcAttr puts each server in its own process group (so stopping it
// reaches anything it forks) and has the kernel kill it when the lab's
// spawning thread, and so the program, goes away, even by SIGKILL.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

func signalGroup(pgid int, sig syscall.Signal) error { return syscall.Kill(-pgid, sig) }

const supported = true
