//go:build !linux

package ferrymq

import "os/exec"

func brokerProcAttr(cmd *exec.Cmd) {}
