"""Harbor, both ways round: our sandboxes as a Harbor environment (`SkyrlEnvironment`) and our
agents as Harbor agents (`TerminusHarborAgent`, `CodeActHarborAgent`) whose trials record the
token ids and logprobs they sampled. (Harbor environments as our sandboxes: the `harbor:TYPE`
backend, skyrl_agent.sandboxes.harbor.)

    harbor run -p TASK -e skyrl_agent.harbor:SkyrlEnvironment \\
        -a skyrl_agent.harbor:TerminusHarborAgent -m smollm2-135m --ak endpoint=http://...
"""

from skyrl_agent.harbor.agents import CodeActHarborAgent, TerminusHarborAgent
from skyrl_agent.sandboxes.harbor_environment import SkyrlEnvironment

__all__ = ["CodeActHarborAgent", "SkyrlEnvironment", "TerminusHarborAgent"]
