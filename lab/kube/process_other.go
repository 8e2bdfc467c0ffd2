//go:build !linux

package kube

import (
	"errors"
	"syscall"
)

const (
	sigTerm = syscall.Signal(15)
	sigKill = syscall.Signal(9)
)

func sysProcAttr() *syscall.SysProcAttr { return nil }

func signalGroup(int, syscall.Signal) error { return errors.New("the lab runs on Linux only") }

const supported = false
