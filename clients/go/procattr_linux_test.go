package ferrymq

import (
	"os/exec"
	"syscall"
)

// brokerProcAttr kills the test broker when the test process dies without cleaning up (a
// timeout, a killed run).
func brokerProcAttr(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
