#!/bin/bash
printf rrrrrrrr > /app/answer.txt
